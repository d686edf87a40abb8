"""dev/gpu/gpu_profile.py without a GPU: reading ncu's raw csv, the stall ranking, the cases, the
answer where nothing can be profiled."""
from __future__ import annotations

import sys

import pytest
import torch

from support.script_loading import REPO, load_script

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# The shape of `ncu --csv --page raw`: ncu's own lines, the header, a units row, one row per launch.
RAW = "\n".join([
    "==PROF== Connected to process 123",
    '"ID","Kernel Name","Grid Size","Block Size","gpu__time_duration.sum","launch__registers_per_thread",'
    f'"{STALL.format("long_scoreboard")}","{STALL.format("barrier")}","{STALL.format("wait")}",'
    f'"{STALL.format("short_scoreboard")}","{STALL.format("not_selected")}","smsp__warps_launched.sum",'
    '"dram__bytes_read.sum","lts__t_sector_hit_rate.pct"',
    '"","","","","usecond","register/thread","","","","","","warp","Gbyte","%"',
    '"0","void vmamba2d::scan2d::scan2d_forward_kernel<float, (vmamba2d::scan2d::Variant)1>(Params)",'
    '"(3072, 32, 1)","(128, 1, 1)","1,204.5","80","5.25","2.5","0.75","1.5","0.25","393216","1.91","61.5"',
    '"1","void vmamba2d::scan2d::scan2d_backward_kernel<float>(Params)","(3072, 32, 1)","(128, 1, 1)",'
    '"3,100.0","128","1.0","4.0","0","n/a","2.0","393216","4.2","40.0"',
])


@pytest.fixture(scope="module")
def gpu_profile():
    sys.path.insert(0, str(REPO / "dev" / "gpu"))  # the tool's cases read bench_scan_cuda's shapes
    return load_script("dev/gpu/gpu_profile.py", "gpu_profile")


def test_raw_csv_rows_skip_ncu_messages_and_the_units_row(gpu_profile):
    rows = gpu_profile.parse_raw_csv(RAW)
    assert [r["ID"] for r in rows] == ["0", "1"]
    assert rows[0]["gpu__time_duration.sum"] == "1,204.5" and rows[1]["launch__registers_per_thread"] == "128"
    assert gpu_profile.parse_raw_csv("==ERROR== no kernels were profiled") == []
    units = gpu_profile.raw_csv_units(RAW)
    assert units["gpu__time_duration.sum"] == "usecond" and units["dram__bytes_read.sum"] == "Gbyte"


def test_stalls_are_ranked_and_unparsable_or_zero_values_left_out(gpu_profile):
    first, second = gpu_profile.parse_raw_csv(RAW)
    assert gpu_profile.top_stalls(first, 3) == [("long_scoreboard", 5.25), ("barrier", 2.5), ("short_scoreboard", 1.5)]
    assert gpu_profile.top_stalls(second) == [("barrier", 4.0), ("not_selected", 2.0), ("long_scoreboard", 1.0)]


def test_summary_rows_name_the_kernel_and_mark_missing_metrics(gpu_profile):
    case = gpu_profile.Case(56, "fp32")
    row = gpu_profile.summary_rows(case, gpu_profile.parse_raw_csv(RAW)[:1], gpu_profile.raw_csv_units(RAW))[0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    titles = [t.strip() for t in gpu_profile.table([]).splitlines()[0].strip("|").split("|")]
    by_title = dict(zip(titles, cells))
    assert cells[0] == "56x56 fp32" and cells[2:4] == ["(3072, 32, 1)", "(128, 1, 1)"]
    assert cells[1] == "scan2d_forward_kernel&lt;float, (Variant)1&gt;"
    assert by_title["time"] == "1,204.5 usecond" and by_title["DRAM % peak"] == "—"  # not in this csv
    # ncu scales byte counts per column: the unit comes along; percentages and counts stay bare.
    assert by_title["DRAM read"] == "1.91 Gbyte" and by_title["DRAM written"] == "—"
    assert by_title["L2 hit %"] == "61.5" and by_title["registers"] == "80"
    assert cells[-1].startswith("long_scoreboard 5.2, barrier 2.5")
    assert len(cells) == len(gpu_profile.table([]).splitlines()[0].strip("|").split("|"))


def test_cases_name_model_shapes_and_dtypes(gpu_profile):
    assert gpu_profile.parse_case("14:bf16") == gpu_profile.Case(14, "bf16")
    for bad in ("13:fp32", "56:int8", "56"):
        with pytest.raises(Exception, match="SIDE:DTYPE"):
            gpu_profile.parse_case(bad)


def test_the_command_keeps_the_clocks_and_filters_our_kernels(gpu_profile):
    command = gpu_profile.ncu_command("ncu", gpu_profile.Case(56, "fp32"))
    assert command[command.index("--clock-control") + 1] == "none"
    assert command[command.index("--kernel-name") + 1] == "regex:scan2d"
    assert command[-2:] == ["--worker", "56:fp32"]
    requested = command[command.index("--metrics") + 1].split(",")
    assert {"dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct"} <= set(requested)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_ncu_or_a_gpu_nothing_is_profiled(gpu_profile, tmp_path, capsys):
    assert gpu_profile.main(["--ncu", str(tmp_path / "no-ncu")]) == 2
    assert "ncu not found" in capsys.readouterr().out
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\nexit 0\n")
    assert gpu_profile.main(["--ncu", str(fake), "--out", str(tmp_path / "r.md")]) == 2
    assert "no GPU visible" in capsys.readouterr().out and not (tmp_path / "r.md").exists()
