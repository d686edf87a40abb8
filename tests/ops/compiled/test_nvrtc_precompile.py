"""`python -m vmamba2d.ops.precompile`: every CUDA kernel compiles with NVRTC for every default arch,
without a GPU, within the ptxas budgets of dev/gpu/ptxas_report.py (the nvcc build's): registers and
static shared memory within the kernel's budget, no spill and no stack frame on any arch."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.script_loading import load_script

from vmamba2d.ops import precompile
from vmamba2d.ops.compiled import nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KERNELS

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

ptxas_report = load_script("dev/gpu/ptxas_report.py", "ptxas_report_for_nvrtc")


def budget_problems(row: precompile.Row) -> list[str]:
    """ptxas_report's budget check of one precompiled kernel: its registers, static shared memory and
    no spill, no stack frame on any arch. A v4 entry's registers are held to its own launch bounds
    (v4_register_cap: a four-route plan compiled for 5 blocks per SM may take 96) instead of the v3
    forward's role budget."""
    c = row.compiled
    resources = ptxas_report.KernelResources(
        source="nvrtc", arch=f"{row.arch // 10}.{row.arch % 10}", mangled=c.lowered_name, entry=True,
        registers=c.resources.registers, spill_stores=c.resources.spill_stores,
        spill_loads=c.resources.spill_loads, stack_bytes=c.resources.stack_bytes,
        static_smem=c.resources.static_smem, barriers=c.resources.barriers, name=row.kernel)
    if not row.kernel.startswith(V4_PREFIXES):
        return ptxas_report.check_budgets(resources)
    cap = v4_register_cap(row.kernel, row.arch)
    resources.entry = False  # the role budget's register check is for entries only
    problems = ptxas_report.check_budgets(resources)
    return problems + ([f"{c.resources.registers} registers > {cap}"] if c.resources.registers > cap else [])


def test_budget_check_flags_spills_and_registers():
    ok = nvrtc.CompiledKernel("forward.fp32.kOneStateSequential", 90, nvrtc.Target(90, "cubin"), b"", "_Z1f",
                              nvrtc.Resources(registers=76))
    assert budget_problems(precompile.Row(ok.spec_name, 90, ok)) == []
    heavy = nvrtc.CompiledKernel("forward.fp32.kOneStateSequential", 90, nvrtc.Target(90, "cubin"), b"", "_Z1f",
                                 nvrtc.Resources(registers=96, spill_stores=4, spill_loads=4, stack_bytes=8))
    assert len(budget_problems(precompile.Row(heavy.spec_name, 90, heavy))) == 3
    route = nvrtc.CompiledKernel("forward.fp32.kRoute", 90, nvrtc.Target(90, "cubin"), b"", "_Z1f",
                                 nvrtc.Resources(registers=96))
    assert budget_problems(precompile.Row(route.spec_name, 90, route)) == []  # route forward: <= 102
    spilled = nvrtc.CompiledKernel("backward.fp32.kOneStateRoute", 90, nvrtc.Target(90, "cubin"), b"", "_Z1f",
                                   nvrtc.Resources(registers=128, spill_stores=4, spill_loads=4, stack_bytes=8))
    assert budget_problems(precompile.Row(spilled.spec_name, 90, spilled)) == ["spills 4+4 B", "stack frame 8 B > 0"]
    deep = nvrtc.CompiledKernel("rows_cross_forward.bf16.v4l4p2s4b5", 90, nvrtc.Target(90, "cubin"), b"", "_Z1f",
                                nvrtc.Resources(registers=96))
    assert budget_problems(precompile.Row("rows_cross_forward.bf16.v4l4p2s4b5", 90, deep)) == []  # 5 blocks: 96
    wide = nvrtc.CompiledKernel("rows_cross_forward.bf16.v4l4s4b6", 90, nvrtc.Target(90, "cubin"), b"", "_Z1f",
                                nvrtc.Resources(registers=96, spill_stores=4, spill_loads=4))
    assert budget_problems(precompile.Row("rows_cross_forward.bf16.v4l4s4b6", 90, wide)) == ["spills 4+4 B",
                                                                                           "96 registers > 80"]


def test_precompile_command_prints_table_and_reuses_cache(tmp_path: Path, capsys):
    newest = max(TOOLCHAIN.archs)
    argv = ["--arch", "80", str(newest + 10), "--kernels", "carry_scan", "--cache-dir", str(tmp_path), "--jobs", "2"]
    assert precompile.main(argv) == 0
    out = capsys.readouterr().out
    assert "| carry_scan | sm_80 | cubin sm_80 |" in out
    assert f"| carry_scan | sm_{newest + 10} | ptx compute_{newest} |" in out
    assert len(list(tmp_path.rglob("*.bin"))) == 2
    assert precompile.main(argv) == 0
    assert capsys.readouterr().out.count(" (cached) |") == 2


def test_precompile_reports_missing_headers_and_bad_arguments(monkeypatch, capsys):
    assert precompile.main(["--kernels", "forward.fp64.kGeneral"]) == 2
    assert "kernel must be one of" in capsys.readouterr().err
    assert precompile.main(["--arch", "60", "--kernels", "carry_scan"]) == 2
    assert "got sm_60" in capsys.readouterr().err
    monkeypatch.setattr(nvrtc, "cuda_include_candidates", lambda: [Path("/nonexistent/include")])
    nvrtc.find_toolchain.cache_clear()
    try:
        assert precompile.main(["--arch", "90"]) == 2
        err = capsys.readouterr().err
        assert "no CUDA headers (cuda_fp16.h, cuda_bf16.h) found in /nonexistent/include" in err
        assert "install a CUDA build of torch" in err
    finally:
        nvrtc.find_toolchain.cache_clear()


@pytest.fixture(scope="module")
def compiled_for(tmp_path_factory):
    """arch -> the precompile rows of every kernel in KERNELS for that arch, compiled once per module
    (the two tests below read the same builds: about a minute per arch on 2 cores)."""
    rows_by_arch: dict[int, list] = {}

    def compiled(arch: int) -> list:
        if arch not in rows_by_arch:
            folder = tmp_path_factory.mktemp(f"sm{arch}")
            rows_by_arch[arch] = precompile.precompile(list(KERNELS.values()), [arch], jobs=2, folder=folder)
        return rows_by_arch[arch]

    return compiled


@pytest.mark.slow
@pytest.mark.parametrize("arch", precompile.DEFAULT_ARCHS)
def test_every_kernel_compiles_within_budget(arch: int, compiled_for):
    rows = compiled_for(arch)
    assert [row.error for row in rows if row.compiled is None] == []
    assert all(row.compiled.target == nvrtc.Target(arch, "cubin") for row in rows)
    problems = {f"{row.kernel} sm_{row.arch}": budget_problems(row) for row in rows}
    assert {name: p for name, p in problems.items() if p} == {}


V4_PREFIXES = ("rows_forward.", "rows_cross_forward.", "planes_forward.")


def v4_register_cap(name: str, arch: int) -> int:
    """Registers the v4 entry's launch bounds allow: 128 threads x 8 blocks per SM (64), the blocks a
    four-route plan names ("b6": 6 blocks, 80 registers, "b5": 5, 96; rows_plan.CrossPlan.min_blocks), else 7
    blocks (72) for the fp16 four-route kernel on sm_75 and the unfolded fp32 one on sm_75 / sm_80
    (csrc/cuda/entries/scan2d_rows_entry.cu)."""
    named = re.search(r"b(\d+)f?$", name) if name.startswith("rows_cross_forward.") else None
    if named:
        blocks = int(named.group(1))
    else:
        seven = (name.startswith("rows_cross_forward.fp16.") and arch == 75) or (
            name.startswith("rows_cross_forward.fp32.") and not name.endswith("f") and arch in (75, 80))
        blocks = 7 if seven else 8
    return 65536 // (128 * blocks) // 8 * 8


def test_v4_register_caps_follow_the_launch_bounds():
    assert v4_register_cap("rows_forward.fp16.r0v8l8p1s3", 75) == 64
    assert v4_register_cap("rows_cross_forward.fp16.v2l2s4", 75) == 72
    assert v4_register_cap("rows_cross_forward.fp16.v2l2s4", 80) == 64
    assert v4_register_cap("rows_cross_forward.fp32.v2l2s4", 75) == 72
    assert v4_register_cap("rows_cross_forward.fp32.v2l2s4", 80) == 72
    assert v4_register_cap("rows_cross_forward.fp32.v2l2s4", 86) == 64
    assert v4_register_cap("rows_cross_forward.fp32.v2l2s3f", 75) == 64  # the folding instance
    assert v4_register_cap("rows_cross_forward.fp16.v4l4s4b6", 75) == 80
    assert v4_register_cap("rows_cross_forward.bf16.v4l4s3b6f", 90) == 80
    assert v4_register_cap("rows_cross_forward.bf16.v4l4p2s4b5", 90) == 96  # two rows ahead: 5 blocks
    assert v4_register_cap("rows_cross_forward.fp16.v2l2p2s3b6", 86) == 80  # two rows ahead at V = 2: 6 blocks
    assert v4_register_cap("rows_cross_forward.bf16.v1l1p2s3", 90) == 64  # at V = 1: the default 8


@pytest.mark.slow
@pytest.mark.parametrize("arch", precompile.DEFAULT_ARCHS)
def test_v4_entries_compile_without_spills(arch: int, compiled_for):
    """The v4 entries (RS per model-width plan at each prefetch depth the tuner may pick, the four-route
    kernel per model width, PL at 7 x 7; each in fp32 / fp16 / bf16) fit their launch bounds' registers with no spill and no stack frame."""
    specs = [spec for name, spec in KERNELS.items() if name.startswith(V4_PREFIXES)]
    assert len(specs) == 18 + 12 + 3
    rows = [row for row in compiled_for(arch) if row.kernel.startswith(V4_PREFIXES)]
    assert [row.error for row in rows if row.compiled is None] == []
    figures = {row.kernel: (row.compiled.resources.spill_stores + row.compiled.resources.spill_loads,
                            row.compiled.resources.stack_bytes) for row in rows}
    assert figures == {spec.name: (0, 0) for spec in specs}
    over = {row.kernel: row.compiled.resources.registers for row in rows
            if row.compiled.resources.registers > v4_register_cap(row.kernel, arch)}
    assert over == {}
