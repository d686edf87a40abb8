"""NVRTC compile path and the on-disk kernel cache, without a GPU.

The kernels here are small programs in a temporary kernel folder (a copy of csrc/cuda/nvrtc_std
beside them), so each compile takes well under a second; tests/ops/compiled/test_nvrtc_precompile.py compiles
the real scan kernels.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vmamba2d.ops.compiled import kernel_cache, nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KERNELS, KernelSpec, kernel_spec

REPO = Path(__file__).resolve().parents[3]

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:  # a CPU-only torch: the rest of the suite covers that
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

SAXPY = textwrap.dedent("""\
    #include <cstdint>
    #include <type_traits>
    #include "saxpy_body.cuh"
    extern "C" __global__ void saxpy(float a, const float* x, float* y, int64_t n) {
      const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
      if (i < n) y[i] = body(a, x[i], y[i]);
    }
    """)
BODY = "__device__ inline float body(float a, float x, float y) { return a * x + y; }\n"
SAXPY_SPEC = KernelSpec(name="saxpy", source="saxpy.cu", symbol="saxpy", name_expression=False)


@pytest.fixture()
def kernel_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "kernels"
    shutil.copytree(REPO / "csrc" / "cuda" / "nvrtc_std", folder / "nvrtc_std")
    (folder / "saxpy.cu").write_text(SAXPY)
    (folder / "saxpy_body.cuh").write_text(BODY)
    return folder


@pytest.fixture()
def toolchain(kernel_dir: Path) -> nvrtc.Toolchain:
    return dataclasses.replace(TOOLCHAIN, kernel_dir=kernel_dir)


def test_target_cubin_for_known_archs_ptx_for_newer_error_for_older():
    known = (75, 80, 86, 90, 120)
    assert nvrtc.target_for(86, known) == nvrtc.Target(86, "cubin")
    assert nvrtc.target_for(89, known) == nvrtc.Target(86, "ptx")
    assert nvrtc.target_for(130, known) == nvrtc.Target(120, "ptx")
    assert nvrtc.target_for(130, known).option == "--gpu-architecture=compute_120"
    with pytest.raises(ValueError, match="arch must be one NVRTC"):
        nvrtc.target_for(70, known)


PTXAS_LOG = """\
ptxas info    : 144 bytes gmem
ptxas info    : Compiling entry function '_Z1av' for 'sm_90'
ptxas info    : Function properties for _Z1av
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 256 bytes smem
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90'
ptxas info    : Function properties for _Z1bv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""


def test_parse_resources_reads_the_named_entry_only():
    assert nvrtc.parse_resources(PTXAS_LOG, "_Z1av") == nvrtc.Resources(
        registers=80, spill_stores=4, spill_loads=12, stack_bytes=8, static_smem=256, barriers=1)
    assert nvrtc.parse_resources(PTXAS_LOG, "_Z1bv") == nvrtc.Resources(registers=32)
    assert nvrtc.parse_resources(PTXAS_LOG, "_Z1cv") == nvrtc.Resources()


def test_kernel_table_names_every_v3_instantiation_once():
    roles = {name.split(".")[0] for name in KERNELS}
    assert roles == {"forward", "backward", "carry_scan", "rows_forward", "rows_cross_forward", "planes_forward"}
    rows = [spec for name, spec in KERNELS.items() if name.startswith("rows_forward.")]
    cross = [name for name in KERNELS if name.startswith("rows_cross_forward.")]
    planes = [name for name in KERNELS if name.startswith("planes_forward.")]
    # v4 RS: 3 dtypes x (4 model plans + P = 2 of the two with V <= 2, which the tuner may pick);
    # four-route: 3 dtypes x 4 widths; PL: 3 dtypes at 7 x 7
    assert len(KERNELS) == 2 * 3 * 4 + 1 + len(rows) + len(cross) + len(planes)
    assert (len(rows), len(cross), len(planes)) == (3 * 6, 3 * 4, 3)
    assert {(spec.source, spec.symbol, spec.name_expression) for spec in rows} == {
        ("entries/scan2d_rows_entry.cu", "vmamba2d_rows_forward", False)}
    assert kernel_spec("backward.bf16.kRoute").symbol == (
        "vmamba2d::scan2d::scan2d_backward_kernel<__nv_bfloat16, vmamba2d::scan2d::Variant::kRoute>")
    with pytest.raises(KeyError, match="kernel must be one of"):
        kernel_spec("forward.fp64.kGeneral")


def test_source_closure_follows_quoted_and_standard_includes():
    closure = nvrtc.source_closure("scan2d_kernels.cuh", TOOLCHAIN.kernel_dir)
    for name in ("scan2d_kernels.cuh", "scan2d_device.cuh", "scan2d_forward.cuh", "scan2d_backward.cuh",
                 "scan2d_common.h", "nvrtc_std/type_traits", "nvrtc_std/cstdint"):
        assert name in closure
    assert "scan2d_driver.h" not in closure  # host code: not part of the kernels' key


def test_compile_small_kernel_to_cubin_and_ptx(toolchain):
    compiled = nvrtc.compile_kernel(SAXPY_SPEC, 80, toolchain)
    assert compiled.target == nvrtc.Target(80, "cubin")
    assert compiled.image[:4] == b"\x7fELF"
    assert compiled.lowered_name == "saxpy"
    assert 0 < compiled.resources.registers <= 32 and compiled.resources.spill_stores == 0
    newest = max(toolchain.archs)
    ptx = nvrtc.compile_kernel(SAXPY_SPEC, newest + 10, toolchain)
    assert ptx.target == nvrtc.Target(newest, "ptx")
    assert b".entry saxpy" in ptx.image and f".target sm_{newest}".encode() in ptx.image


def test_name_expression_resolves_a_template_to_its_mangled_name(toolchain):
    (toolchain.kernel_dir / "tmpl.cuh").write_text(
        "namespace ns { template <class T> __global__ void fill(T* p) { p[threadIdx.x] = T(1); } }\n")
    spec = KernelSpec(name="fill.float", source="tmpl.cuh", symbol="ns::fill<float>")
    compiled = nvrtc.compile_kernel(spec, 90, toolchain)
    assert compiled.lowered_name == "_ZN2ns4fillIfEEvPT_"
    assert nvrtc.parse_resources(compiled.log, compiled.lowered_name).registers > 0


def test_compile_error_carries_nvrtc_log(toolchain):
    (toolchain.kernel_dir / "saxpy_body.cuh").write_text("__device__ float body(float a) { return a + undefined_name; }\n")
    with pytest.raises(nvrtc.NvrtcCompileError, match="undefined_name") as info:
        nvrtc.compile_kernel(SAXPY_SPEC, 90, toolchain)
    assert "could not compile saxpy for sm_90" in str(info.value)


def test_macros_reach_the_program(toolchain):
    (toolchain.kernel_dir / "macro.cu").write_text(
        '#ifndef WIDTH\n#error "WIDTH not set"\n#endif\nextern "C" __global__ void k(float* p) { p[WIDTH] = 0.f; }\n')
    spec = KernelSpec(name="macro", source="macro.cu", symbol="k", name_expression=False, defines=(("WIDTH", "7"),))
    assert nvrtc.program_source(spec) == '#define WIDTH 7\n#include "macro.cu"\n'
    assert nvrtc.compile_kernel(spec, 90, toolchain).image[:4] == b"\x7fELF"


def test_cache_key_depends_on_included_sources_arch_and_nvrtc(toolchain):
    target = nvrtc.Target(90, "cubin")
    key = nvrtc.cache_key(toolchain, SAXPY_SPEC, target)
    assert key == nvrtc.cache_key(toolchain, SAXPY_SPEC, target)
    assert key != nvrtc.cache_key(toolchain, SAXPY_SPEC, nvrtc.Target(86, "cubin"))
    assert key != nvrtc.cache_key(dataclasses.replace(toolchain, version=(99, 0)), SAXPY_SPEC, target)
    (toolchain.kernel_dir / "unrelated.cuh").write_text("// not included\n")
    assert key == nvrtc.cache_key(toolchain, SAXPY_SPEC, target)
    (toolchain.kernel_dir / "saxpy_body.cuh").write_text(BODY.replace("a * x + y", "a * x - y"))
    assert key != nvrtc.cache_key(toolchain, SAXPY_SPEC, target)


def test_cache_miss_compiles_then_hits(toolchain, tmp_path):
    folder = tmp_path / "cache"
    first, cached = kernel_cache.get_kernel(SAXPY_SPEC, 86, folder, toolchain, announce=False)
    assert not cached
    again, cached = kernel_cache.get_kernel(SAXPY_SPEC, 86, folder, toolchain, announce=False)
    assert cached and again.image == first.image and again.resources == first.resources
    assert [p.suffix for p in folder.rglob("*") if p.is_file()] == [".bin"]  # no temporary left


def test_source_change_invalidates_the_entry(toolchain, tmp_path):
    folder = tmp_path / "cache"
    old, _ = kernel_cache.get_kernel(SAXPY_SPEC, 90, folder, toolchain, announce=False)
    (toolchain.kernel_dir / "saxpy_body.cuh").write_text(BODY.replace("a * x + y", "a * x - y"))
    new, cached = kernel_cache.get_kernel(SAXPY_SPEC, 90, folder, toolchain, announce=False)
    assert not cached and new.image != old.image
    assert len(list(folder.rglob("*.bin"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "foreign", "garbage"])
def test_bad_entry_is_rebuilt_with_one_warning(toolchain, tmp_path, damage):
    folder = tmp_path / "cache"
    good, _ = kernel_cache.get_kernel(SAXPY_SPEC, 90, folder, toolchain, announce=False)
    _, path, key = kernel_cache.lookup(SAXPY_SPEC, 90, folder, toolchain)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) - 100])
    elif damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "foreign":  # another kernel's whole entry under this key's name
        other = dataclasses.replace(good, image=b"other")
        path.write_bytes(kernel_cache.encode_entry("0" * 64, other))
    else:
        path.write_bytes(b"\0" * 64)
    with pytest.warns(RuntimeWarning, match="unusable") as record:
        rebuilt, cached = kernel_cache.get_kernel(SAXPY_SPEC, 90, folder, toolchain, announce=False)
    assert len(record) == 1 and "\n" not in str(record[0].message)
    assert not cached and rebuilt.image == good.image
    assert kernel_cache.decode_entry(path.read_bytes(), key).image == good.image


def test_unwritable_cache_folder_falls_back_to_temporary_with_warning(toolchain, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(kernel_cache, "_fallback_dir", lambda: tmp_path / "fallback")
    with pytest.warns(RuntimeWarning, match="not writable"):
        kernel, cached = kernel_cache.get_kernel(SAXPY_SPEC, 90, blocker / "cache", toolchain, announce=False)
    assert not cached
    assert len(list((tmp_path / "fallback").rglob("*.bin"))) == 1


def test_default_cache_folder_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(kernel_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.default_cache_dir() == tmp_path / "xdg" / "vmamba2d"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kernel_cache.default_cache_dir() == tmp_path / "home" / ".cache" / "vmamba2d"
    monkeypatch.setenv(kernel_cache.CACHE_ENV, str(tmp_path / "mine"))
    assert kernel_cache.default_cache_dir() == tmp_path / "mine"


def test_first_compile_of_a_process_is_announced_once(toolchain, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kernel_cache, "_announced", False)
    kernel_cache.get_kernel(SAXPY_SPEC, 90, tmp_path / "c", toolchain)
    kernel_cache.get_kernel(SAXPY_SPEC, 86, tmp_path / "c", toolchain)
    err = capsys.readouterr().err
    assert err.count("vmamba2d: compiled the CUDA kernel") == 1 and "saxpy for sm_90" in err


CONCURRENT_USER = textwrap.dedent("""\
    import dataclasses, sys, time
    from pathlib import Path
    from vmamba2d.ops.compiled import kernel_cache, nvrtc
    from vmamba2d.ops.compiled.cuda_kernels import KernelSpec
    kernel_dir, folder, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    toolchain = dataclasses.replace(nvrtc.find_toolchain(), kernel_dir=kernel_dir)
    spec = KernelSpec(name="saxpy", source="saxpy.cu", symbol="saxpy", name_expression=False)
    (ready / sys.argv[4]).touch()
    while len(list(ready.iterdir())) < 4:  # every process imported: first uses at the same time
        time.sleep(0.005)
    kernel, cached = kernel_cache.get_kernel(spec, 90, folder, toolchain, announce=False)
    print(len(kernel.image), cached)
    """)


@pytest.mark.slow
def test_four_processes_first_use_leave_one_valid_entry(toolchain, tmp_path):
    folder, ready = tmp_path / "cache", tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_USER, str(toolchain.kernel_dir), str(folder),
                               str(ready), str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
             for rank in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    entries = [p for p in folder.rglob("*") if p.is_file()]
    assert len(entries) == 1 and entries[0].suffix == ".bin"
    _, path, key = kernel_cache.lookup(SAXPY_SPEC, 90, folder, toolchain)
    image = kernel_cache.decode_entry(path.read_bytes(), key).image
    assert {out.split()[0] for out, _ in outputs} == {str(len(image))}


@pytest.mark.slow
def test_wheel_carries_what_nvrtc_and_the_host_driver_need(tmp_path):
    """setup.py's build_py copies the kernel sources into the package; NVRTC compiles from that copy
    alone (a wheel install has no csrc/), and the host driver's source is beside it."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=REPO,
                   check=True, capture_output=True, timeout=300)
    packaged = tmp_path / "vmamba2d" / "csrc" / "cuda"
    assert (packaged.parent / "nvrtc" / "selective_scan_2d_nvrtc.cpp").is_file()
    assert (packaged / "nvrtc_std" / "type_traits").is_file()
    toolchain = dataclasses.replace(TOOLCHAIN, kernel_dir=packaged)
    compiled = nvrtc.compile_kernel(kernel_spec("carry_scan"), 80, toolchain)
    assert compiled.image[:4] == b"\x7fELF"
    assert nvrtc.cache_key(toolchain, kernel_spec("carry_scan"), compiled.target) == nvrtc.cache_key(
        TOOLCHAIN, kernel_spec("carry_scan"), compiled.target)  # same sources, same key: a moved install keeps its cache


def test_compiling_leaves_the_process_shared_bytes_objects_alone(toolchain):
    """NVRTC fills the log / image buffers in place; a PTX compile has an empty log (size 1), and
    filling CPython's shared one-byte b" " made torch.save write unreadable checkpoints afterwards."""
    import io

    import torch

    nvrtc.compile_kernel(SAXPY_SPEC, max(toolchain.archs) + 10, toolchain)
    nvrtc.compile_kernel(SAXPY_SPEC, 80, toolchain)
    assert bytes([32]) == b" " and b" " * 1 == b"\x20"
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(32.0)}, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=True)["w"], torch.arange(32.0))
