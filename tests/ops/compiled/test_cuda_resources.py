"""CUDA build targets and resources, checked without a GPU.

* the default arch list and its intersection with what nvcc supports (vmamba2d/_cuda_archs.py);
* the per-device kernel-image check (``extensions.cuda_kernel_usable``) against a stand-in
  extension module, and the real extension's entry point where it is built;
* the ptxas resource report of every kernel instantiation on every default build arch nvcc supports
  (dev/gpu/ptxas_report.py): zero spills, registers / shared memory / stack within the budgets stated
  in the tool (skipped without nvcc).
"""
from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import types
from pathlib import Path
from typing import Optional

import pytest
import torch

from vmamba2d.ops import backend_info
from vmamba2d.ops.compiled import extensions

from support.script_loading import load_script


archs = load_script("vmamba2d/_cuda_archs.py", "vmamba2d_cuda_archs_under_test")


# --------------------------------------------------------------------------------------------
# default arch list


def test_default_archs_cover_volta_to_hopper_with_ptx():
    choice = archs.default_arch_choice(None)
    assert choice.arch_list == "7.0;7.5;8.0;8.6;9.0+PTX"
    assert choice.dropped == () and choice.reason == ""


def test_archs_that_nvcc_lacks_are_dropped_with_a_reason():
    nvcc13 = frozenset({"7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"})
    choice = archs.default_arch_choice(nvcc13, "nvcc 13.0")
    assert choice.arch_list == "7.5;8.0;8.6;9.0+PTX"
    assert choice.archs == ("7.5", "8.0", "8.6", "9.0")
    assert choice.dropped == ("7.0",) and "nvcc 13.0" in choice.reason


def test_ptx_moves_to_the_newest_kept_arch_when_its_own_arch_is_missing():
    old_nvcc = frozenset({"7.0", "7.5", "8.0", "8.6"})
    choice = archs.default_arch_choice(old_nvcc)
    assert choice.arch_list == "7.0;7.5;8.0;8.6+PTX" and choice.dropped == ("9.0",)


def test_no_supported_default_arch_is_an_error():
    with pytest.raises(RuntimeError, match="TORCH_CUDA_ARCH_LIST"):
        archs.default_arch_choice(frozenset({"12.0"}))


@pytest.mark.parametrize("name, arch", [("compute_70", "7.0"), ("sm_86", "8.6"), ("compute_90a", "9.0"),
                                        ("compute_100", "10.0"), ("compute_121", "12.1"), ("sm", None)])
def test_arch_names_parse(name, arch):
    assert archs.arch_from_compute_name(name) == arch


def test_arch_list_parsing_strips_ptx_and_duplicates():
    assert archs.parse_arch_list("8.0;9.0+PTX 9.0 Hopper,8.6") == ("8.0", "9.0", "8.6")
    assert archs.sm_name("8.6") == "sm_86" and archs.sm_name("9.0a") == "sm_90a"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_installed_nvcc_lists_its_archs():
    supported = archs.nvcc_supported_archs(shutil.which("nvcc"))
    assert supported and all(archs.parse_arch_list(a) == (a,) for a in supported)
    assert archs.nvcc_release(shutil.which("nvcc")) != "unknown"


# --------------------------------------------------------------------------------------------
# per-device kernel-image check, Python side


@pytest.fixture
def fake_cuda_extension(monkeypatch):
    """A stand-in _C_cuda whose kernel images cover the devices listed in ``images``."""
    calls: list[int] = []
    module = types.SimpleNamespace(images=set())

    def kernel_image_available(device_index: int) -> bool:
        calls.append(device_index)
        return device_index in module.images

    module.kernel_image_available = kernel_image_available
    module.kernel_image_arch = lambda device_index: 86  # the sm_86 code runs there
    module.calls = calls
    monkeypatch.setattr(extensions, "cuda_extension", lambda: module)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"Tesla V100 #{index}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setitem(extensions._failure_reasons, "vmamba2d._C_cuda", "")
    monkeypatch.setitem(extensions._sources, "cuda", "built")  # the nvcc build; a test switches to "nvrtc"
    extensions._cuda_kernel_usable_on.cache_clear()
    extensions.cuda_kernel_arch.cache_clear()
    yield module
    extensions._cuda_kernel_usable_on.cache_clear()
    extensions.cuda_kernel_arch.cache_clear()


def test_kernel_arch_is_reported_only_where_a_kernel_image_runs(fake_cuda_extension):
    fake_cuda_extension.images = {0}
    assert extensions.cuda_kernel_arch(0) == 86
    assert extensions.cuda_kernel_arch(1) is None  # no kernel image for that GPU


def test_backend_info_reports_no_kernel_arch_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU answer")
    assert backend_info()["cuda_kernel_arch"] is None


def test_device_with_a_kernel_image_is_usable_and_asked_once(fake_cuda_extension):
    fake_cuda_extension.images = {0}
    assert extensions.cuda_kernel_usable(torch.device("cuda", 0))
    assert extensions.cuda_kernel_usable(torch.device("cuda", 0))
    assert fake_cuda_extension.calls == [0]  # cached: no driver query per call


def test_device_without_a_kernel_image_is_refused_with_the_arch_to_build(fake_cuda_extension):
    fake_cuda_extension.images = {0}
    assert not extensions.cuda_kernel_usable(torch.device("cuda"))  # index None: current device (1)
    assert fake_cuda_extension.calls == [1]
    reason = extensions.failure_reason("cuda")
    assert "Tesla V100 #1" in reason and "sm_70" in reason and "TORCH_CUDA_ARCH_LIST" in reason


def test_device_older_than_nvrtc_targets_is_refused_naming_it(fake_cuda_extension, monkeypatch):
    monkeypatch.setitem(extensions._sources, "cuda", "nvrtc")
    assert not extensions.cuda_kernel_usable(torch.device("cuda", 0))
    reason = extensions.failure_reason("cuda")
    assert reason == "NVRTC targets no arch as old as Tesla V100 #0 (sm_70)", reason


def test_a_failing_runtime_query_makes_the_kernel_unusable_with_its_reason(fake_cuda_extension):
    def broken(device_index: int) -> bool:
        raise RuntimeError("cudaGetDeviceCount failed (cudaErrorInsufficientDriver: driver too old)")

    fake_cuda_extension.kernel_image_available = broken
    assert not extensions.cuda_kernel_usable(torch.device("cuda", 0))
    assert "cudaErrorInsufficientDriver" in extensions.failure_reason("cuda")


def test_missing_extension_is_not_usable(monkeypatch):
    monkeypatch.setattr(extensions, "cuda_extension", lambda: None)
    extensions._cuda_kernel_usable_on.cache_clear()
    try:
        assert not extensions.cuda_kernel_usable(torch.device("cuda", 0))
    finally:
        extensions._cuda_kernel_usable_on.cache_clear()


def _built_cuda_module():
    try:
        return importlib.import_module("vmamba2d._C_cuda")
    except ImportError:
        return None


@pytest.mark.skipif(_built_cuda_module() is None, reason="vmamba2d._C_cuda is not built")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_built_probe_without_a_gpu_raises_a_clear_error():
    with pytest.raises(RuntimeError, match="kernel_image_available: cudaGetDeviceCount failed"):
        _built_cuda_module().kernel_image_available(0)


@pytest.mark.skipif(_built_cuda_module() is None, reason="vmamba2d._C_cuda is not built")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_built_kernel_image_arch_without_a_gpu_names_the_device_index():
    with pytest.raises(ValueError, match=r"kernel_image_arch: device_index must be in \[0, 0\), got 0"):
        _built_cuda_module().kernel_image_arch(0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or _built_cuda_module() is None,
                    reason="needs a GPU and vmamba2d._C_cuda")
def test_built_probe_on_the_gpu():
    module = _built_cuda_module()
    assert module.kernel_image_available(0) is True, "built without this GPU's arch?"
    major, minor = torch.cuda.get_device_capability(0)
    assert 75 <= module.kernel_image_arch(0) <= 10 * major + minor  # the code's arch, at most the GPU's
    with pytest.raises(ValueError, match="device_index"):
        module.kernel_image_available(torch.cuda.device_count())


# --------------------------------------------------------------------------------------------
# ptxas resource report

ptxas_report = load_script("dev/gpu/ptxas_report.py", "ptxas_report_under_test")
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on PATH")

PTXAS_SM75 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z14scan_fwd_kernelPf' for 'sm_75'
ptxas info    : Function properties for _Z14scan_fwd_kernelPf
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 2048 bytes smem, 352 bytes cmem[0]
ptxas info    : Function properties for _Z6helperv
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z15scan_bwd_kernelPf' for 'sm_75'
ptxas info    : Function properties for _Z15scan_bwd_kernelPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 352 bytes cmem[0]
"""


def test_ptxas_output_is_parsed_per_kernel():
    kernels = ptxas_report.parse_ptxas(PTXAS_SM75, "k.cu", "7.5")
    by_name = {k.mangled: k for k in kernels}
    fwd, helper, bwd = by_name["_Z14scan_fwd_kernelPf"], by_name["_Z6helperv"], by_name["_Z15scan_bwd_kernelPf"]
    assert (fwd.entry, fwd.registers, fwd.spill_stores, fwd.spill_loads, fwd.static_smem, fwd.barriers) == (
        True, 72, 8, 4, 2048, 1)
    assert (helper.entry, helper.stack_bytes) == (False, 16)
    assert (bwd.registers, bwd.static_smem, bwd.spill_stores) == (168, 0, 0)


def test_budgets_flag_spills_stack_and_registers():
    kernels = ptxas_report.parse_ptxas(PTXAS_SM75, "k.cu", "7.5")
    for kernel in kernels:
        kernel.name = kernel.mangled
    problems = {k.mangled: ptxas_report.check_budgets(k) for k in kernels}
    assert problems["_Z14scan_fwd_kernelPf"] == ["spills 8+4 B"]
    assert problems["_Z6helperv"] == ["stack frame 16 B > 0"]
    assert problems["_Z15scan_bwd_kernelPf"] == []  # 168 registers: within the backward budget
    over = ptxas_report.KernelResources("k.cu", "9.0", "m", entry=True, registers=96, name="fwd_kernel")
    assert ptxas_report.check_budgets(over) == ["96 registers > 80"]


PLANTED_KERNEL = (
    "__global__ void planted_forward_kernel(float* out, const int* index, int n) {\n"
    "  float scratch[256];\n"
    "  for (int i = 0; i < 256; ++i) scratch[i] = out[i * n + threadIdx.x];\n"
    "  out[threadIdx.x] = scratch[index[threadIdx.x] & 255];\n"
    "}\n")


@needs_nvcc
def test_planted_local_array_fails_the_check(tmp_path, capsys):
    (tmp_path / "planted.cu").write_text(PLANTED_KERNEL)
    assert ptxas_report.main(["--sources", str(tmp_path), "--archs", "8.0"]) == 1
    out = capsys.readouterr().out
    assert "`planted_forward_kernel` | sm_80" in out and "FAIL: stack frame" in out


# cuobjdump -res-usage of a fatbin with sm_80 machine code of two kernels and sm_90 PTX
RES_USAGE = """\

Fatbin elf code:
================
arch = sm_80
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _Z14scan_fwd_kernelPf:
  REG:72 STACK:0 SHARED:2048 LOCAL:0 CONSTANT[0]:372 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z15scan_bwd_kernelPf:
  REG:168 STACK:16 SHARED:0 LOCAL:32 CONSTANT[0]:372 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin ptx code:
================
arch = sm_90
code version = [9,0]
host = linux
compile_size = 64bit
compressed
"""


def test_cuobjdump_resource_usage_is_parsed_per_kernel_and_arch():
    kernels = ptxas_report.parse_res_usage(RES_USAGE, "lib.so")
    assert [(k.mangled, k.arch, k.registers, k.stack_bytes, k.static_smem) for k in kernels] == [
        ("_Z14scan_fwd_kernelPf", "8.0", 72, 0, 2048), ("_Z15scan_bwd_kernelPf", "8.0", 168, 32, 0)]
    assert all(k.entry and not k.spills_known for k in kernels)  # the PTX section has no kernels
    for kernel in kernels:
        kernel.name = kernel.mangled
    assert [ptxas_report.check_budgets(k) for k in kernels] == [[], ["stack frame 32 B > 0"]]


def _built_cuda_library(archs_needed: list[str]) -> Optional[Path]:
    """The built vmamba2d._C_cuda when cuobjdump reads machine code of every arch in it."""
    spec = importlib.util.find_spec("vmamba2d._C_cuda")
    cuobjdump = ptxas_report.find_cuda_tool("cuobjdump", NVCC)
    if spec is None or spec.origin is None or cuobjdump is None:
        return None
    library = Path(spec.origin)
    return library if all(r.ok for r in ptxas_report.read_binary(cuobjdump, library, archs_needed)) else None


@needs_nvcc
def test_planted_local_array_in_a_binary_fails_the_check(tmp_path, capsys):
    source = tmp_path / "planted.cu"
    source.write_text(PLANTED_KERNEL)
    fatbin = tmp_path / "planted.fatbin"
    subprocess.run([NVCC, "-fatbin", "-gencode", "arch=compute_80,code=sm_80", "-gencode",
                    "arch=compute_90,code=compute_90", "-o", str(fatbin), str(source)], check=True)
    if ptxas_report.find_cuda_tool("cuobjdump", NVCC) is None:
        pytest.skip("no cuobjdump")
    assert ptxas_report.main(["--binary", str(fatbin), "--archs", "8.0", "9.0"]) == 1
    out = capsys.readouterr().out
    assert "`planted_forward_kernel` | sm_80 | 32 | n/a | 1024 |" in out and "FAIL: stack frame" in out
    assert "no sm_90 machine code" in out  # the PTX is not machine code


@needs_nvcc
@pytest.mark.slow
def test_scan_kernels_are_within_their_resource_budgets(tmp_path, capsys):
    """The nvcc build's kernels within their budgets: read off the built extension for every default
    build arch nvcc supports where it has them all (a second); else compiled for the newest of them
    only, the arch of the GPU comparison the opt-in nvcc build is for (ptxas allocates registers per
    arch -- a kernel may spill on sm_86 and not on sm_80 / sm_90 --, so `make ptxas-check` compiles
    every arch: about four minutes on 2 cores; what pip users run, the NVRTC images, is held on every
    arch by test_nvrtc_precompile)."""
    archs_here, _ = ptxas_report.default_archs(NVCC)
    out = tmp_path / "ptxas.md"
    library = _built_cuda_library(archs_here)
    if not library:
        archs_here = archs_here[-1:]
    source = ["--binary", str(library)] if library else ["--jobs", "2"]
    status = ptxas_report.main([*source, "--archs", *archs_here, "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "`" in line]
    for arch in archs_here:
        sm = archs.sm_name(arch)
        assert any("forward" in row and f"| {sm} |" in row for row in rows), sm
        assert any("backward" in row and f"| {sm} |" in row for row in rows), sm
    assert all(row.rstrip(" |").endswith("ok") for row in rows)

