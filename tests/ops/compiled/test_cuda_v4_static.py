"""Static budgets of the v4 row-streaming forward (dev/gpu/v4_static_report.py): compiled for sm_90 with
nvcc (no GPU), the model widths' instances keep <= 64 registers, no spills or stack, no block
barrier, and their streaming loop within the SASS-per-cell·channel ratchet. Skipped without nvcc."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.script_loading import load_script

report = load_script("dev/gpu/v4_static_report.py", "vmamba2d_v4_static_report")
NVCC, DISASSEMBLER = report.find_tools(None)
needs_nvcc = pytest.mark.skipif(NVCC is None or DISASSEMBLER is None, reason="nvcc / nvdisasm not found")


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_model_widths_hold_the_budgets(dtype):
    rows = report.run(NVCC, DISASSEMBLER, ["sm_90"], [dtype], list(report.WIDTHS))
    assert len(rows) == len(report.WIDTHS)
    assert all(r.per_cell_channel is not None and r.loop_instructions > 50 for r in rows)
    assert report.budget_failures(rows) == []


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("route", [1, 4, 8])  # from_right, columns first, flat
def test_other_routes_fit_the_registers(route):
    rows = report.run(NVCC, DISASSEMBLER, ["sm_90"], ["fp32", "bf16"], [56], route)
    for r in rows:
        assert r.registers <= report.MAX_REGISTERS and r.spill_bytes == 0 and r.stack_bytes == 0, r
        assert r.barriers == 0 and r.per_cell_channel is not None, r


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_four_route_kernel_holds_its_budgets(dtype):
    rows = report.run_cross(NVCC, DISASSEMBLER, ["sm_90"], [dtype], list(report.WIDTHS))
    vecs = [2, 2, 2, 1] if dtype == "fp32" else [4, 4, 2, 1]  # rows_plan.cross_plan
    assert [r.vec for r in rows] == [report.cross_vec(dtype, w) for w in report.WIDTHS] == vecs[:len(rows)]
    assert all(r.per_cell_channel is not None and r.loop_instructions > 50 for r in rows)
    assert report.cross_budget_failures(rows) == []


@pytest.mark.slow
@needs_nvcc
def test_four_route_pair_holds_the_plans_figures():
    # V = 2 and V = 4 one row ahead and the deeper ring (bf16: V = 4, fp32: V = 2, two rows) at 56 / 28,
    # and at 14 / 7 the V that divides (2, 1) one and two rows ahead, in bf16 and fp32 on sm_90: within
    # their launch bounds, no spills, and the figures rows_plan's estimate reads (CROSS_VEC_FIGURES) are
    # the compiled ones.
    rows = report.run_cross_pair(NVCC, DISASSEMBLER, ["bf16", "fp32"])
    wide = {"bf16": 4, "fp32": 2}
    assert [(r.dtype, r.width, r.vec, r.prefetch) for r in rows] == [
        (d, w, v, p) for d in ("bf16", "fp32") for w in (56, 28, 14, 7)
        for v, p in (((2, 1), (4, 1), (wide[d], 2)) if w % 4 == 0 else ((w // 7, 1), (w // 7, 2)))]
    assert report.cross_pair_failures(rows) == []
    # four columns, or two rows ahead at V >= 2, need more than the default 64 registers: the plan's cap
    # holds them; at one column two rows ahead fit 64
    assert all(r.registers > 64 for r in rows if r.vec == 4 or (r.prefetch == 2 and r.vec == 2))
    assert all(r.registers <= 64 for r in rows if r.vec == 1)
    # bf16 two rows ahead at 4 columns needs more than the one-row kernel's 80 (it spills there): 5 blocks, 96
    assert all(80 < r.registers <= 96 for r in rows if r.dtype == "bf16" and r.prefetch == 2 and r.vec == 4)


def test_pair_checks_catch_what_they_hold():
    row = report.Row("sm_90", "bf16", 56, 4, 1, 2, registers=80, spill_bytes=0, stack_bytes=0, barriers=0,
                     loop_instructions=300.0, per_cell_channel=164.4, resident_warps=24, in_flight_kib=15.8)
    assert report.cross_pair_failures([row]) == []
    assert report.cross_pair_failures([report.Row(**{**row.__dict__, "per_cell_channel": 180.0})]) == [
        "four-route sm_90 bf16 W=56 V=4 P=1: rows_plan.CROSS_VEC_FIGURES has (164.4, 80), compiled (180.0, 80)"]
    assert report.cross_pair_failures([report.Row(**{**row.__dict__, "registers": 88})])[0] == (
        "four-route sm_90 bf16 W=56 V=4 P=1: 88 registers > 80")
    table = report.format_pair_table([row])
    assert table.splitlines()[-1] == "| bf16 | 56 | 4 | 1 | 6 | 80 | 0 / 0 | 164.4 | 24 | 15.8 | 87% | 68% | 4 / 2 |"
    deep = report.Row(**{**row.__dict__, "prefetch": 2, "registers": 96, "per_cell_channel": 172.0,
                         "resident_warps": 20, "in_flight_kib": 26.25})
    assert report.cross_pair_failures([deep]) == []
    assert report.format_pair_table([deep]).splitlines()[-1] == (
        "| bf16 | 56 | 4 | 2 | 5 | 96 | 0 / 0 | 172.0 | 20 | 26.2 | 83% | 100% | 4 / 2 |")
    assert report.cross_pair_failures([report.Row(**{**deep.__dict__, "registers": 100})]) == [
        "four-route sm_90 bf16 W=56 V=4 P=2: 100 registers > 96",
        "four-route sm_90 bf16 W=56 V=4 P=2: rows_plan.CROSS_VEC_FIGURES has (172.0, 96), compiled (172.0, 100)"]


def test_cross_budgets_catch_spills_and_registers():
    spilling = report.Row("sm_90", "bf16", 28, 1, 1, 1, registers=64, spill_bytes=8, stack_bytes=8, barriers=0,
                          loop_instructions=160.0, per_cell_channel=160.0, resident_warps=32, in_flight_kib=12.0)
    clean = report.Row("sm_90", "fp32", 56, 2, 1, 1, registers=64, spill_bytes=0, stack_bytes=0, barriers=0,
                       loop_instructions=170.0, per_cell_channel=190.0, resident_warps=32, in_flight_kib=24.0)
    assert report.cross_budget_failures([spilling, clean]) == ["four-route sm_90 bf16 W=28: 8 bytes of spills, "
                                                               "8 bytes of stack"]
    # 72 registers: the fp16 kernel's launch bounds on sm_75 only.
    wide = report.Row("sm_75", "fp16", 28, 2, 1, 2, registers=72, spill_bytes=0, stack_bytes=0, barriers=0,
                      loop_instructions=170.0, per_cell_channel=190.0, resident_warps=28, in_flight_kib=12.0)
    assert report.cross_budget_failures([wide]) == []
    assert report.cross_budget_failures([report.Row(**{**wide.__dict__, "dtype": "bf16"})]) == [
        "four-route sm_75 bf16 W=28: 72 registers > 64"]
    # 4 columns a lane: the plan's blocks per SM give the cap (6 -> 80 fp16 / bf16 on every arch, 5 -> 96 fp32)
    four = report.Row("sm_75", "fp16", 28, 4, 1, 4, registers=80, spill_bytes=0, stack_bytes=0, barriers=0,
                      loop_instructions=170.0, per_cell_channel=150.0, resident_warps=24, in_flight_kib=15.0)
    assert report.cross_budget_failures([four]) == []
    assert report.cross_budget_failures([report.Row(**{**four.__dict__, "registers": 81})]) == [
        "four-route sm_75 fp16 W=28: 81 registers > 80"]
    assert report.cross_budget_failures([report.Row(**{**four.__dict__, "dtype": "fp32", "registers": 96})]) == []
    # two rows ahead (fp16 / bf16 at 4 columns): 5 blocks -> 96
    deep = report.Row(**{**four.__dict__, "prefetch": 2, "registers": 96})
    assert report.cross_budget_failures([deep]) == []
    assert report.cross_budget_failures([report.Row(**{**deep.__dict__, "registers": 104})]) == [
        "four-route sm_75 fp16 W=28: 104 registers > 96"]


def test_cross_budgets_hold_the_sm90_ratchet():
    row = report.Row("sm_90", "bf16", 56, 2, 1, 1, registers=63, spill_bytes=0, stack_bytes=0, barriers=0,
                     loop_instructions=220.0, per_cell_channel=251.1, resident_warps=32, in_flight_kib=24.0)
    failures = report.cross_budget_failures([row])
    assert len(failures) == 1 and "251.1 SASS" in failures[0]
    # Other archs report their figures without a ratchet.
    assert report.cross_budget_failures([report.Row(**{**row.__dict__, "arch": "sm_80"})]) == []
    # Two rows ahead: their own ratchet.
    deep = report.Row("sm_90", "bf16", 56, 4, 2, 2, registers=96, spill_bytes=0, stack_bytes=0, barriers=0,
                      loop_instructions=600.0, per_cell_channel=172.0, resident_warps=20, in_flight_kib=26.25)
    assert report.cross_budget_failures([deep]) == []
    assert report.cross_budget_failures([report.Row(**{**deep.__dict__, "per_cell_channel": 174.5})]) == [
        "four-route sm_90 bf16 W=56: 174.5 SASS per cell·channel > 174.0"]
    # Every (dtype, W) the plan holds two rows ahead has a ratchet of its own.
    for dtype in report.DTYPES:
        for width in report.WIDTHS:
            if report.cross_prefetch(dtype, width, report.cross_vec(dtype, width)) == 2:
                assert (dtype, width) in report.CROSS_DEEP_LOOP_BUDGET, (dtype, width)


def test_budgets_catch_what_they_hold():
    row = report.Row("sm_90", "fp32", 56, 4, 1, 2, registers=72, spill_bytes=8, stack_bytes=8, barriers=1,
                     loop_instructions=200.0, per_cell_channel=57.1, resident_warps=24, in_flight_kib=40.0)
    failures = report.budget_failures([row])
    assert len(failures) == 4
    assert any("72 registers" in f for f in failures) and any("block barriers" in f for f in failures)
    assert any("spills" in f for f in failures) and any("57.1 SASS" in f for f in failures)


def test_resident_warps_follow_the_register_allocation():
    # 256 registers a warp at a time, 128-thread blocks: the table's 48 / 38 / 64 registers give 40 /
    # 48 / 32 warps on sm_90; sm_75 holds at most 32.
    assert [report.resident_warps(r, "sm_90") for r in (48, 38, 64, 0)] == [40, 48, 32, 64]
    assert report.resident_warps(38, "sm_75") == 32


def test_written_reports_say_where_they_come_from(monkeypatch, tmp_path):
    # Both reports' files (this one and dev/gpu/v4_static_planes.py's) come from write_report.
    monkeypatch.setattr(report, "provenance", lambda nvcc: f"host (x86_64, {nvcc}), today, commit abc")
    path = tmp_path / "report.md"
    report.write_report(path, "Title", "tool.py", "nvcc 13", "A note.", "| table |", ["W=7 broke"])
    assert path.read_text() == ("# Title\n\nWritten by `dev/gpu/tool.py --write` on host (x86_64, nvcc 13), today, "
                                "commit abc. A note.\n\n| table |\n\nBudget broken: W=7 broke\n")


def _nvrtc_headers() -> Path | None:
    try:
        import nvidia
    except ImportError:
        return None
    for base in nvidia.__path__:
        for sub in ("cu13/include", "cuda_runtime/include"):
            if (Path(base) / sub / "cuda_bf16.h").is_file():
                return Path(base) / sub
    return None


@pytest.mark.parametrize("dtype,width,route", [("bf16", 56, 0), ("fp32", 7, 11), ("fp16", 14, 6), ("bf16", 56, -1)])
def test_entry_compiles_with_nvrtc(dtype, width, route):
    # route -1: the four-route entry (VMAMBA2D_RS_CROSS=1) at its plan's lane width and blocks per SM
    # (bf16 at 56: V = 4, two rows ahead, 5 blocks).
    # The launcher's path: NVRTC (no nvcc), the plan's macros, the CUDA headers torch's wheels bring.
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    headers = _nvrtc_headers()
    if headers is None:
        pytest.skip("no CUDA headers from the nvidia wheels")
    plan, defines = report.plan_for(dtype, width)
    defines["VMAMBA2D_RS_ROUTE"] = max(route, 0) & ~2
    entry = "vmamba2d_rows_forward"
    if route < 0:
        cross = report.cross_plan_for(dtype, width)
        defines.update(VMAMBA2D_RS_CROSS=1, VMAMBA2D_RS_VEC=cross.vec, VMAMBA2D_RS_LOAD=cross.vec,
                       VMAMBA2D_RS_STEPS=cross.scan_steps, VMAMBA2D_RS_PREFETCH=cross.prefetch,
                       **cross.min_blocks_define())
        entry = "vmamba2d_rows_cross_forward"
    source = report.ENTRY.read_bytes()
    err, prog = nvrtc.nvrtcCreateProgram(source, report.ENTRY.name.encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    options = [b"--gpu-architecture=sm_90", b"-std=c++17", b"--ptxas-options=-v",
               f"-I{report.CUDA_SOURCES}".encode(), f"-I{headers}".encode(),
               *[f"-D{k}={v}".encode() for k, v in defines.items()]]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    log = bytearray(size)  # NVRTC writes into it: never a (possibly shared) bytes object
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = bytes(log).decode(errors="replace")
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, text
    _, cubin = nvrtc.nvrtcGetCUBINSize(prog)
    assert cubin > 0
    assert "0 bytes spill stores" in text and entry in text
    nvrtc.nvrtcDestroyProgram(prog)
