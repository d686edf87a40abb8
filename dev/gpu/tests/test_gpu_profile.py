"""dev/gpu/gpu_profile.py without a GPU: reading ncu's raw csv and source page (hand-written samples
in ncu's shape), the stall ranking, the kernel filter against the NVRTC table's kernel names, pairing
ncu's rows with the launcher's log, the per-cell figures, the budget, the commands, the answer
where nothing can be profiled."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

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

# A case's run in base units (--print-units base): the four-route forward without and with autograd,
# then two v3 backward-pass launches; the numbers make the per-cell figures round (cells = 1e8).
V3_FORWARD = "void vmamba2d::scan2d::scan2d_forward_kernel<__nv_bfloat16, (vmamba2d::scan2d::Variant)3>" \
             "(vmamba2d::scan2d::Params)"
V3_BACKWARD = "void vmamba2d::scan2d::scan2d_backward_kernel<__nv_bfloat16, (vmamba2d::scan2d::Variant)3>" \
              "(vmamba2d::scan2d::Params)"
CASE_COLUMNS = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum", "dram__bytes_read.sum",
                "dram__bytes_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
                "lts__t_sectors_srcunit_tex_op_write.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "smsp__inst_executed.sum",
                "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
                STALL.format("long_scoreboard")]
CASE_UNITS = ["", "", "", "", "nsecond", "byte", "byte", "sector", "sector", "sector", "request", "inst", "%", "%",
              "ratio"]
CROSS_ROW = ["vmamba2d_rows_cross_forward", "(6144, 1, 1)", "(128, 1, 1)", "1,000,000", "1,000,000,000",
             "500,000,000", "50,000,000", "25,000,000", "8,000,000", "2,000,000", "250,000,000", "40.0", "62.5", "3.5"]
CASE_ROWS = [
    ["0"] + CROSS_ROW,  # the no_grad forward
    ["1"] + CROSS_ROW,  # the training step's forward
    ["2", V3_FORWARD, "(3072, 4, 1)", "(128, 1, 1)", "2,000,000", "300,000,000", "100,000,000", "", "", "", "", "",
     "", "", "1.0"],
    ["3", V3_BACKWARD, "(3072, 4, 1)", "(128, 1, 1)", "3,000,000", "700,000,000", "900,000,000", "", "", "", "", "",
     "", "", "2.0"],
]
CROSS_SYMBOL = "vmamba2d_rows_cross_forward"
SYMBOL = "vmamba2d::scan2d::scan2d_{}_kernel<__nv_bfloat16, vmamba2d::scan2d::Variant::kOneStateRoute>"


def _csv_line(cells) -> str:
    return ",".join(f'"{cell}"' for cell in cells)


def case_csv(rows=CASE_ROWS) -> str:
    return "\n".join(["==PROF== Connected to process 7 (/usr/bin/python3.12)", "vmamba2d: compiling ...",
                      _csv_line(CASE_COLUMNS), _csv_line(CASE_UNITS)] + [_csv_line(r) for r in rows])


def launch_log(torn: bool = False) -> str:
    records = [
        {"kind": "info", "batch": 2, "dim": 96, "side": 56, "dtype": "bf16", "cells": 100_000_000,
         "torch": "2.11", "fwd_bytes": 1_200_000_000},
        {"kind": "warmup", "warmup_s": 4.5},
        {"kind": "launch", "phase": "fwd", "profiled": True, "kernel": "rows_cross_forward.bf16.v4l4p2s4b5",
         "symbol": CROSS_SYMBOL, "grid": [6144, 1, 1], "threads": 128, "smem": 0},
        {"kind": "launch", "phase": "fwd (autograd)", "profiled": True,
         "kernel": "rows_cross_forward.bf16.v4l4p2s4b5", "symbol": CROSS_SYMBOL, "grid": [6144, 1, 1],
         "threads": 128, "smem": 0},
        {"kind": "launch", "phase": "bwd", "profiled": True, "kernel": "forward.bf16.kOneStateRoute",
         "symbol": SYMBOL.format("forward"), "grid": [3072, 4, 1], "threads": 128, "smem": 1024},
        {"kind": "launch", "phase": "bwd", "profiled": True, "kernel": "backward.bf16.kOneStateRoute",
         "symbol": SYMBOL.format("backward"), "grid": [3072, 4, 1], "threads": 128, "smem": 1024},
    ]
    text = "\n".join(json.dumps(r) for r in records) + "\n"
    return text + ('{"kind": "launch", "phase": "bw' if torn else "")


# The shape of `ncu --import R --csv --page source --print-source sass`.
SOURCE = "\n".join([
    '"Kernel Name","vmamba2d_rows_cross_forward"',
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
    '"Instructions Executed","stall_long_sb","stall_wait"',
    '"0x7f1200000000","MOV R1, c[0x0][0x28]","2","1","4,096","0","2"',
    '"0x7f1200000010","LDG.E.128 R4, desc[UR4][R2.64]","10","8","98,304","1","3"',
    '"0x7f1200000020","@P0 FFMA R8, R4, R5, R8","60","50","1,572,864","55","5"',
    '"0x7f1200000030","SHFL.UP PT, R9, R8, 0x1, RZ","28","20","393,216","0","28"',
    '"0x7f1200000040","EXIT","0","0","4,096","0","0"',
]) + "\n"


@pytest.fixture(scope="module")
def gpu_profile():
    sys.path.insert(0, str(REPO / "dev" / "gpu"))
    return load_script("dev/gpu/gpu_profile.py", "gpu_profile")


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split(" | ")]


def _by_title(gpu_profile, launch) -> dict[str, str]:
    titles = [title for title, _ in gpu_profile.LAUNCH_COLUMNS]
    cells = _cells(gpu_profile.launch_row(launch))
    assert len(cells) == len(titles)
    return dict(zip(titles, cells))


def test_raw_csv_rows_skip_ncu_messages_and_the_units_row(gpu_profile):
    rows = gpu_profile.parse_raw_csv(RAW)
    assert [r["ID"] for r in rows] == ["0", "1"]
    assert rows[0]["gpu__time_duration.sum"] == "1,204.5" and rows[1]["launch__registers_per_thread"] == "128"
    assert gpu_profile.parse_raw_csv("==ERROR== no kernels were profiled") == []
    units = gpu_profile.raw_csv_units(RAW)
    assert units["gpu__time_duration.sum"] == "usecond" and units["dram__bytes_read.sum"] == "Gbyte"


def test_metric_values_scale_ncu_units_to_bytes_and_seconds(gpu_profile):
    first, _ = gpu_profile.parse_raw_csv(RAW)
    units = gpu_profile.raw_csv_units(RAW)
    assert gpu_profile.metric_value(first, units, "gpu__time_duration.sum") == pytest.approx(1204.5e-6)
    assert gpu_profile.metric_value(first, units, "dram__bytes_read.sum") == pytest.approx(1.91e9)
    assert gpu_profile.metric_value(first, units, "lts__t_sector_hit_rate.pct") == 61.5  # % stays as it is
    assert gpu_profile.metric_value(first, units, "launch__registers_per_thread") == 80
    assert gpu_profile.metric_value(first, units, "dram__bytes_write.sum") is None  # not in this csv


def test_stalls_are_ranked_and_unparsable_or_zero_values_left_out(gpu_profile):
    first, second = gpu_profile.parse_raw_csv(RAW)
    assert gpu_profile.top_stalls(first, 3) == [("long_scoreboard", 5.25), ("barrier", 2.5), ("short_scoreboard", 1.5)]
    assert gpu_profile.top_stalls(second) == [("barrier", 4.0), ("not_selected", 2.0), ("long_scoreboard", 1.0)]


@pytest.mark.parametrize("name, function", [
    ("void vmamba2d::scan2d::scan2d_forward_kernel<float, (vmamba2d::scan2d::Variant)1>(vmamba2d::scan2d::Params)",
     "scan2d_forward_kernel"),
    ("vmamba2d::scan2d::scan2d_backward_kernel<__half, vmamba2d::scan2d::Variant::kRoute>", "scan2d_backward_kernel"),
    ("void vmamba2d::scan2d::scan2d_carry_scan_kernel(vmamba2d::scan2d::Params, vmamba2d::scan2d::CarryScan)",
     "scan2d_carry_scan_kernel"),
    ("scan2d_forward_kernel", "scan2d_forward_kernel"),
    ("vmamba2d_rows_cross_forward", "vmamba2d_rows_cross_forward"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char *, 1>>(int, at::native::FillFunctor<float>, std::array<char *, 1>)",
     "vectorized_elementwise_kernel"),
])
def test_function_name_drops_return_type_namespaces_templates_and_parameters(gpu_profile, name, function):
    assert gpu_profile.function_name(name) == function


def _filter(gpu_profile) -> re.Pattern:
    prefix, _, pattern = gpu_profile.KERNEL_FILTER.partition(":")
    assert prefix == "regex"
    return re.compile(pattern)


def test_the_kernel_filter_matches_every_nvrtc_kernel_and_no_torch_kernel(gpu_profile):
    from vmamba2d.ops.compiled import rows_backward_launch
    from vmamba2d.ops.compiled.cuda_kernels import KERNELS

    pattern = _filter(gpu_profile)
    symbols = {spec.symbol for spec in KERNELS.values()}
    symbols |= {rows_backward_launch.BACKWARD_SYMBOL, rows_backward_launch.SAVE_SYMBOL}
    assert {"vmamba2d_rows_cross_forward", "vmamba2d_rows_forward", "vmamba2d_planes_forward"} <= symbols
    for symbol in symbols:  # as ncu may name it: the name expression or extern "C" name, the bare function
        assert pattern.search(symbol) and pattern.search(gpu_profile.function_name(symbol)), symbol
    cross = re.compile(gpu_profile.CROSS_KERNEL_FILTER.partition(":")[2])
    assert [s for s in symbols if cross.search(s)] == ["vmamba2d_rows_cross_forward"]
    for torch_kernel in (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
            "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4>(long)",
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)",
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)",
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast>(int)"):
        assert not pattern.search(torch_kernel) and not pattern.search(gpu_profile.function_name(torch_kernel))


@pytest.mark.slow
def test_the_kernel_filter_matches_the_names_nvrtc_gives_the_v3_kernels(gpu_profile):
    """The v3 kernels are templates: their names on the GPU are NVRTC's lowered (mangled) names,
    which ncu shows demangled or as the bare function."""
    from vmamba2d.ops.compiled import nvrtc
    from vmamba2d.ops.compiled.cuda_kernels import KERNELS

    try:
        toolchain = nvrtc.find_toolchain()
    except nvrtc.NvrtcUnavailable as err:
        pytest.skip(f"no NVRTC here: {err}")
    pattern = _filter(gpu_profile)
    demangler = shutil.which("c++filt")
    for name in ("forward.bf16.kOneStateRoute", "backward.fp32.kGeneral", "carry_scan"):
        spec = KERNELS[name]
        lowered = nvrtc.compile_kernel(spec, 90, toolchain).lowered_name
        assert lowered.startswith("_Z") and pattern.search(lowered), lowered
        if demangler:
            demangled = subprocess.run([demangler, lowered], capture_output=True, text=True).stdout.strip()
            assert pattern.search(demangled) and pattern.search(gpu_profile.function_name(demangled))
            assert gpu_profile.function_name(demangled) == gpu_profile.function_name(spec.symbol)


def test_the_log_reads_info_and_launches_and_skips_a_torn_line(gpu_profile):
    info, launches = gpu_profile.read_launch_log(launch_log(torn=True))
    assert info["cells"] == 100_000_000 and info["warmup_s"] == 4.5 and info["fwd_bytes"] == 1_200_000_000
    assert [l.phase for l in launches] == ["fwd", "fwd (autograd)", "bwd", "bwd"]
    assert launches[1].kernel == "rows_cross_forward.bf16.v4l4p2s4b5" and all(l.profiled for l in launches)


def test_rows_are_paired_with_the_profiled_launches_in_order_while_names_agree(gpu_profile):
    rows = gpu_profile.parse_raw_csv(case_csv())
    _, logged = gpu_profile.read_launch_log(launch_log())
    labels, note = gpu_profile.attribute(rows, logged)
    assert [l.kernel for l in labels] == ["rows_cross_forward.bf16.v4l4p2s4b5", "rows_cross_forward.bf16.v4l4p2s4b5",
                                          "forward.bf16.kOneStateRoute", "backward.bf16.kOneStateRoute"]
    assert note == ""
    # ncu cut off after three launches: those three paired, a note says so
    labels, note = gpu_profile.attribute(rows[:3], logged)
    assert [l.phase for l in labels] == ["fwd", "fwd (autograd)", "bwd"] and "3 launches profiled, 4 logged" in note
    # a launch the filter missed: pairing stops at the first name that differs
    missed = [l for l in logged if l.kernel != "forward.bf16.kOneStateRoute"]
    labels, note = gpu_profile.attribute(rows, missed)
    assert [l.phase for l in labels[:2]] == ["fwd", "fwd (autograd)"] and labels[2:] == [None, None]
    assert "first 2 paired" in note


def test_a_case_row_gives_bytes_sectors_and_instructions_per_cell(gpu_profile):
    case = gpu_profile.Case(56, "bf16")
    run = gpu_profile.Run(0, case_csv(), "", 42.0)
    result = gpu_profile.case_result(case, run, launch_log())
    assert result.error == ""
    assert [(l.phase, l.kernel) for l in result.launches] == [
        ("fwd", "rows_cross_forward.bf16.v4l4p2s4b5"), ("fwd (autograd)", "rows_cross_forward.bf16.v4l4p2s4b5"),
        ("bwd", "forward.bf16.kOneStateRoute"), ("bwd", "backward.bf16.kOneStateRoute")]
    cross = _by_title(gpu_profile, result.launches[0])
    assert cross["case"] == "56x56 bf16" and cross["grid"] == "(6144, 1, 1)"
    assert cross["ms"] == "1.000"  # 1,000,000 ns
    assert cross["DRAM MB read / written"] == "1,000.0 / 500.0"
    assert cross["DRAM B/cell"] == "15.00"  # 1.5e9 bytes over 1e8 cells
    assert cross["L2 B/cell"] == "24.00"  # 75e6 sectors x 32 B over 1e8 cells
    assert cross["sectors/req ld / st"] == "4.00 / —"
    assert cross["inst/cell"] == "80.0"  # 250e6 warp instructions x 32 over 1e8 cells
    assert cross["occupancy % achieved / theoretical"] == "40.0 / 62.5"
    assert cross["regs"] == "—" and cross["L2 hit %"] == "—"  # not in this csv
    assert cross[f"top {gpu_profile.TOP_STALLS} stalls (warps per issue-active cycle)"] == "long_scoreboard 3.5"
    assert any("forward launched rows_cross_forward.bf16.v4l4p2s4b5: the same kernels as the no_grad fwd" in n
               for n in result.notes)


def test_phase_totals_sum_the_launches_beside_the_bytes_the_forward_must_move(gpu_profile):
    case = gpu_profile.Case(56, "bf16")
    result = gpu_profile.case_result(case, gpu_profile.Run(0, case_csv(), "", 1.0), launch_log())
    fwd, train_fwd, bwd = (_cells(row) for row in gpu_profile.phase_rows(result))
    assert train_fwd[1:] == ["fwd (autograd)"] + fwd[2:]
    by_title = dict(zip(gpu_profile.PHASE_TITLES, fwd))
    assert by_title["launches"] == "1" and by_title["DRAM B/cell"] == "15.00"
    assert by_title["must-move B/cell"] == "12.00" and by_title["must-move GB/s"] == "1,200"  # 1.2 GB in 1 ms
    assert by_title["DRAM GB/s"] == "1,500"
    by_title = dict(zip(gpu_profile.PHASE_TITLES, bwd))
    assert by_title["launches"] == "2" and by_title["ms"] == "5.000" and by_title["DRAM MB"] == "2,000.0"
    assert by_title["DRAM B/cell"] == "20.00" and by_title["must-move B/cell"] == "—"


def test_a_failed_or_cut_off_run_is_an_error_with_what_it_printed(gpu_profile):
    case = gpu_profile.Case(14, "bf16")
    cut = gpu_profile.case_result(case, gpu_profile.Run(None, "", "==PROF== Connected", 90.0), "")
    assert "cut off" in cut.error and cut.launches == []
    refused = gpu_profile.case_result(
        case, gpu_profile.Run(1, "", "==ERROR== Failed to find metric lts__foo.sum", 5.0), "")
    assert "ncu exit 1, 0 launches" in refused.error and gpu_profile._METRIC_REJECTED.search(refused.error)
    locked = gpu_profile.case_result(case, gpu_profile.Run(1, "", "==ERROR== ERR_NVGPUCTRPERM - no access", 5.0), "")
    assert gpu_profile._PROFILER_UNUSABLE.search(locked.error)


def test_the_source_page_ranks_sass_instructions_by_stall_samples(gpu_profile):
    groups = gpu_profile.parse_source_csv("==PROF== Connected\n" + SOURCE)
    assert [g.kernel for g in groups] == ["vmamba2d_rows_cross_forward"] and len(groups[0].rows) == 5
    top = gpu_profile.top_sass(groups[0], 3)
    assert [line.instruction for line in top] == ["@P0 FFMA R8, R4, R5, R8", "SHFL.UP PT, R9, R8, 0x1, RZ",
                                                  "LDG.E.128 R4, desc[UR4][R2.64]"]
    assert [line.samples for line in top] == [60, 28, 10] and top[0].share == pytest.approx(60.0)
    assert top[0].executed == 1_572_864 and top[0].reason == "stall_long_sb 55" and top[1].reason == "stall_wait 28"
    table = gpu_profile.sass_table(top)
    assert "| 1 | 0x7f1200000020 | `@P0 FFMA R8, R4, R5, R8` | 60 | 60.0 | 1,572,864 | stall_long_sb 55 |" in table
    assert gpu_profile.top_sass(gpu_profile.SourceGroup("k", ["Address", "Source"], [["0x0", "EXIT"]])) == []


def test_the_budget_gives_each_step_its_cap_or_what_is_left_and_skips_short_ends(gpu_profile):
    now = [100.0]
    budget = gpu_profile.Budget(420, clock=lambda: now[0])
    assert budget.allot(100) == 100
    now[0] += 300
    assert budget.remaining() == 120 and budget.allot(100) == 100
    now[0] += 75
    assert budget.allot(100) == 45  # less left than the cap: what is left
    now[0] += 20
    assert budget.allot(100) is None and budget.remaining() == 25  # under the floor: skipped
    now[0] += 100
    assert budget.remaining() == 0


def test_precompile_takes_the_four_route_op_kernels_of_the_cases_dtypes(gpu_profile):
    from vmamba2d.ops.compiled.cuda_kernels import KERNELS, model_cross_kernels

    names = gpu_profile.precompile_kernels(["bf16", "fp32"])
    assert set(names) <= set(KERNELS) and "carry_scan" in names
    for dtype in ("bf16", "fp32"):
        assert {spec.name for spec in model_cross_kernels() if f".{dtype}." in spec.name} <= set(names)
        assert {f"{role}.{dtype}.{variant}" for role in ("forward", "backward")
                for variant in ("kGeneral", "kOneStateSequential", "kRoute", "kOneStateRoute")} <= set(names)
    assert not [n for n in names if ".fp16." in n or n.startswith(("rows_forward", "planes_forward"))]


def test_the_commands_profile_only_the_ranges_and_read_the_source_page(gpu_profile, tmp_path):
    case = gpu_profile.Case(56, "bf16")
    command = gpu_profile.ncu_command("ncu", case, 128, tmp_path / "log.jsonl")
    after = lambda flag: command[command.index(flag) + 1]  # noqa: E731
    assert after("--clock-control") == "none" and after("--profile-from-start") == "off"
    assert after("--kernel-name") == gpu_profile.KERNEL_FILTER and after("--print-units") == "base"
    sections = {command[i + 1] for i, arg in enumerate(command) if arg == "--section"}
    assert sections == {"SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
                        "MemoryWorkloadAnalysis"}
    requested = set(after("--metrics").split(","))
    assert {"dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "smsp__inst_executed.sum"} <= requested
    assert command[-8:] == ["--worker", "56:bf16", "--batch", "128", "--phases", "fwd,bwd", "--launch-log",
                            str(tmp_path / "log.jsonl")]
    collect, read = gpu_profile.source_commands("ncu", case, 64, tmp_path / "s.jsonl", tmp_path / "s.ncu-rep")
    assert "SourceCounters" in collect and collect[collect.index("--kernel-name") + 1] == gpu_profile.CROSS_KERNEL_FILTER
    assert collect[collect.index("--export") + 1] == str(tmp_path / "s")  # ncu adds .ncu-rep
    assert collect[-8:] == ["--worker", "56:bf16", "--batch", "64", "--phases", "fwd", "--launch-log",
                            str(tmp_path / "s.jsonl")]
    assert read == ["ncu", "--import", str(tmp_path / "s.ncu-rep"), "--csv", "--page", "source", "--print-source",
                    "sass"]
    env = gpu_profile.child_env({"PYTHONPATH": "/x", "VMAMBA2D_CUDA_KERNELS": "built"})
    assert env["VMAMBA2D_CUDA_KERNELS"] == "nvrtc" and env["PYTHONPATH"].split(":") == [str(REPO), "/x"]


def test_cases_name_the_tiny_stages_and_dtypes(gpu_profile):
    assert gpu_profile.parse_case("14:bf16") == gpu_profile.Case(14, "bf16")
    assert gpu_profile.stage_channels() == {56: 96, 28: 192, 14: 384, 7: 768}
    for bad in ("13:fp32", "56:int8", "56"):
        with pytest.raises(Exception, match="SIDE:DTYPE"):
            gpu_profile.parse_case(bad)
    assert gpu_profile.parse_phases("fwd") == ("fwd",)
    with pytest.raises(Exception, match="subset"):
        gpu_profile.parse_phases("fwd,train")


def test_the_launcher_wrapper_logs_launches_only_inside_a_phase(gpu_profile, tmp_path):
    class Spec:
        name, symbol = "carry_scan", "vmamba2d::scan2d::scan2d_carry_scan_kernel"

    class Launcher:
        def __init__(self):
            self.calls = []

        def launch(self, spec, grid, threads, smem, args):
            self.calls.append(spec.name)

    launcher, log = Launcher(), gpu_profile.LaunchLog(tmp_path / "log.jsonl")
    gpu_profile._record_launches(launcher, log)
    launcher.launch(Spec(), (1, 1, 1), 128, 0, [b""])  # no phase: launched, not logged
    log.phase, log.profiled = "bwd", True
    launcher.launch(Spec(), (2, 1, 1), 128, 64, [b""])
    assert launcher.calls == ["carry_scan", "carry_scan"]
    _, logged = gpu_profile.read_launch_log((tmp_path / "log.jsonl").read_text())
    assert logged == [gpu_profile.Logged("bwd", True, "carry_scan", Spec.symbol)]


def test_a_case_run_by_a_stand_in_ncu_keeps_its_csv_and_report(gpu_profile, tmp_path):
    """profile_case end to end with a stand-in for ncu that writes the worker's log and prints csv."""
    (tmp_path / "case.csv").write_text(case_csv())
    (tmp_path / "case.jsonl").write_text(launch_log())
    fake = tmp_path / "ncu"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import shutil, sys
        log = sys.argv[sys.argv.index("--launch-log") + 1]
        shutil.copy({str(tmp_path / "case.jsonl")!r}, log)
        print(open({str(tmp_path / "case.csv")!r}).read())
    """))
    fake.chmod(0o755)
    work, csv_dir = tmp_path / "work", tmp_path / "out" / "ncu"
    work.mkdir()
    case = gpu_profile.Case(56, "bf16")
    result = gpu_profile.profile_case(str(fake), case, 2, 60.0, work, csv_dir, gpu_profile.STALL_METRICS)
    assert result.error == "" and len(result.launches) == 4
    assert (csv_dir / "ncu-56-bf16.csv").read_text().strip() == case_csv().strip()
    report = gpu_profile.Report(["# title"], results=[result], notes=["run took 1 s"])
    out = tmp_path / "out" / "gpu-profile.md"
    gpu_profile.write_report(out, report.render())
    text = out.read_text()
    assert "## Launches" in text and "| 56x56 bf16 | fwd | rows_cross_forward.bf16.v4l4p2s4b5 |" in text
    assert "## Per case and phase" in text and "- run took 1 s" in text
    assert sorted(p.name for p in out.parent.iterdir()) == ["gpu-profile.md", "ncu"]  # no temporary left


def test_a_run_past_its_limit_is_killed_and_keeps_its_output(gpu_profile):
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    run = gpu_profile.run_bounded(sleeper, 2.0, {})
    assert run.returncode is None and run.stdout.strip() == "started"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_ncu_or_a_gpu_nothing_is_profiled(gpu_profile, tmp_path, capsys):
    assert gpu_profile.main(["--ncu", str(tmp_path / "no-ncu")]) == 2
    assert "ncu not found" in capsys.readouterr().out
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\nexit 0\n")
    assert gpu_profile.main(["--ncu", str(fake), "--out", str(tmp_path / "r.md")]) == 2
    assert "no GPU visible" in capsys.readouterr().out and not (tmp_path / "r.md").exists()


def _stand_in_ncu(tmp_path, fail: str = "") -> str:
    """A stand-in for ncu: answers --version, prints SOURCE for --import, and for a profiled worker
    writes the worker's log, then prints the case csv (or, with --export, makes the report file).
    ``fail``: "locked" (counters unreadable) or "metrics" (refuses --metrics)."""
    (tmp_path / "case.csv").write_text(case_csv())
    (tmp_path / "case.jsonl").write_text(launch_log())
    (tmp_path / "source.csv").write_text(SOURCE)
    (tmp_path / "calls").write_text("")
    fake = tmp_path / "ncu"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import shutil, sys
        argv = sys.argv[1:]
        with open({str(tmp_path / "calls")!r}, "a") as calls:
            calls.write(" ".join(argv) + "\\n")
        if "--version" in argv:
            sys.exit(print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0 (build 1)"))
        if "--import" in argv:
            sys.exit(print(open({str(tmp_path / "source.csv")!r}).read()))
        if {fail!r} == "locked":
            sys.exit(print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", file=sys.stderr) or 1)
        if {fail!r} == "metrics" and "--metrics" in argv:
            sys.exit(print("==ERROR== Failed to find metric lts__t_sectors_srcunit_tex_op_read.sum") or 1)
        shutil.copy({str(tmp_path / "case.jsonl")!r}, argv[argv.index("--launch-log") + 1])
        if "--export" in argv:
            open(argv[argv.index("--export") + 1] + ".ncu-rep", "w").write("report")
        else:
            print(open({str(tmp_path / "case.csv")!r}).read())
    """))
    fake.chmod(0o755)
    return str(fake)


@pytest.fixture
def as_if_on_a_gpu(gpu_profile, monkeypatch):
    """main's GPU queries answered as on an H200 whose NVRTC path is ready."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(gpu_profile, "_cuda_path_ready", lambda: "")
    monkeypatch.setenv("VMAMBA2D_CUDA_KERNELS", "auto")  # restored after the test; main sets nvrtc


def test_a_whole_run_with_a_stand_in_ncu_writes_every_step(gpu_profile, as_if_on_a_gpu, tmp_path, capsys):
    ncu = _stand_in_ncu(tmp_path)
    out, csv_dir = tmp_path / "out" / "gpu-profile.md", tmp_path / "out" / "ncu"
    code = gpu_profile.main(["--ncu", ncu, "--no-precompile", "--cases", "56:bf16", "14:bf16", "--batch", "2",
                             "--out", str(out), "--csv-dir", str(csv_dir)])
    assert code == 0
    text = out.read_text()
    assert "- device: NVIDIA H200" in text and "ncu Version 2099.1.0" in text
    assert "| 56x56 bf16 | fwd | rows_cross_forward.bf16.v4l4p2s4b5 |" in text
    assert "| 14x14 bf16 | bwd | backward.bf16.kOneStateRoute |" in text
    assert "## Top 10 SASS instructions by warp-stall samples: vmamba2d_rows_cross_forward, 56x56 bf16" in text
    assert "`@P0 FFMA R8, R4, R5, R8`" in text and "- run took" in text
    assert sorted(p.name for p in csv_dir.iterdir()) == ["ncu-14-bf16.csv", "ncu-56-bf16.csv",
                                                        "ncu-source-56-bf16.csv"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split("--worker ")[1].split()[0] for c in calls if "--worker" in c] == ["56:bf16", "14:bf16", "56:bf16"]
    assert "--phases fwd --launch-log" in calls[-2] and "SourceCounters" in calls[-2]
    assert os.environ["VMAMBA2D_CUDA_KERNELS"] == "nvrtc"


def test_a_machine_whose_counters_are_locked_stops_after_the_first_case(gpu_profile, as_if_on_a_gpu, tmp_path):
    ncu = _stand_in_ncu(tmp_path, fail="locked")
    out = tmp_path / "gpu-profile.md"
    assert gpu_profile.main(["--ncu", ncu, "--no-precompile", "--cases", "56:bf16", "14:bf16", "--out",
                             str(out)]) == 1
    text = out.read_text()
    assert "ERR_NVGPUCTRPERM" in text and "the remaining steps are skipped" in text
    assert sum("--worker" in c for c in (tmp_path / "calls").read_text().splitlines()) == 1


def test_a_refused_metric_is_profiled_again_with_the_sections_alone(gpu_profile, as_if_on_a_gpu, tmp_path):
    ncu = _stand_in_ncu(tmp_path, fail="metrics")
    out = tmp_path / "gpu-profile.md"
    assert gpu_profile.main(["--ncu", ncu, "--no-precompile", "--cases", "56:bf16", "14:bf16", "--source-case",
                             "none", "--out", str(out)]) == 0
    text = out.read_text()
    assert "ncu refused a requested metric" in text and "| 14x14 bf16 | fwd |" in text
    workers = [c for c in (tmp_path / "calls").read_text().splitlines() if "--worker" in c]
    assert ["--metrics" in c for c in workers] == [True, False, False]
