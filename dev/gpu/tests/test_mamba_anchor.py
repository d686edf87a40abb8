"""Issue 39's 1D anchor on the CPU: dev/gpu/mamba_anchor.py (unpacking a synthetic sdist, the
forward-only build's sources and the backward specializations it generates, the build folder's
reuse) and dev/gpu/bench_anchor.py (shapes and byte arithmetic, the binding call, the table, the
exits without a GPU or a built anchor). No network, no GPU, nothing timed."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from support.script_loading import load_gpu_tool

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "dev" / "gpu"
FETCHED = REPO / "build" / "mamba-anchor"  # where `make mamba-anchor` puts the real sources, when it ran


@pytest.fixture(scope="module")
def anchor():
    return load_gpu_tool("mamba_anchor")


@pytest.fixture(scope="module")
def bench():
    return load_gpu_tool("bench_anchor")


# ------------------------------------------------------------------------------------------------
# fetch
# ------------------------------------------------------------------------------------------------
def _sdist(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


SYNTHETIC = {
    "pkg-1.0/setup.py": b"setup()",
    "pkg-1.0/LICENSE": b"license text",
    "pkg-1.0/csrc/selective_scan/selective_scan.cpp": b"// binding",
    "pkg-1.0/csrc/selective_scan/selective_scan_fwd_fp32.cu": b"// forward",
    "pkg-1.0/csrc/selective_scan/nested/deeper.h": b"// not one of the folder's own files",
    "pkg-1.0/csrc/selective_scan/../../escape.txt": b"outside",
    "pkg-1.0/csrc/other/kernel.cu": b"// another extension",
    "../outside.txt": b"outside",
}


def test_unpack_keeps_only_the_selective_scan_sources_and_the_license(anchor, tmp_path):
    sdist = _sdist(tmp_path / "pkg-1.0.tar.gz", SYNTHETIC)
    out = tmp_path / "anchor"
    stale = out / "csrc" / "selective_scan" / "stale.cu"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier unpack")
    info = anchor.unpack_sources(sdist, out, expected_sha256=None)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == [anchor.INFO_FILE, "LICENSE", "csrc/selective_scan/selective_scan.cpp",
                       "csrc/selective_scan/selective_scan_fwd_fp32.cu"]
    assert (out / "csrc/selective_scan/selective_scan_fwd_fp32.cu").read_bytes() == b"// forward"
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "outside.txt").exists()
    assert info["sha256"] == hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert info["version"] == anchor.VERSION and info["sdist"] == "pkg-1.0.tar.gz"
    assert anchor.read_info(out) == info == json.loads((out / anchor.INFO_FILE).read_text())


def test_an_sdist_other_than_the_pinned_one_is_refused(anchor, tmp_path):
    sdist = _sdist(tmp_path / "pkg-1.0.tar.gz", SYNTHETIC)
    with pytest.raises(SystemExit, match=f"expected {anchor.SDIST_SHA256}"):
        anchor.main(["fetch", "--sdist", str(sdist), "--dir", str(tmp_path / "anchor")])
    assert anchor.read_info(tmp_path / "anchor") is None
    empty = _sdist(tmp_path / "empty.tar.gz", {"pkg-1.0/setup.py": b""})
    with pytest.raises(SystemExit, match="no files under"):
        anchor.unpack_sources(empty, tmp_path / "anchor", expected_sha256=None)


# ------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------
BINDING = """
#define DISPATCH_ITYPE_TWO(ITYPE, NAME, ...)       \\
    if (ITYPE == at::ScalarType::Float) {          \\
        using input_t = float;                     \\
        __VA_ARGS__();                             \\
    } else {                                       \\
        using input_t = at::BFloat16;              \\
        __VA_ARGS__();                             \\
    }
#define DISPATCH_WTYPE_ONE(WTYPE, NAME, ...)       \\
    if (WTYPE == at::ScalarType::Float) {          \\
        using weight_t = float;                    \\
        __VA_ARGS__();                             \\
    }
#define DISPATCH_WTYPE_CPLX(WTYPE, NAME, ...)      \\
    if (WTYPE == at::ScalarType::Float) {          \\
        using weight_t = float;                    \\
        __VA_ARGS__();                             \\
    } else {                                       \\
        using weight_t = c10::complex<float>;      \\
        __VA_ARGS__();                             \\
    }
void fwd() {
    DISPATCH_ITYPE_TWO(u.scalar_type(), "fwd", [&] {
        DISPATCH_WTYPE_ONE(A.scalar_type(), "fwd", [&] {
            selective_scan_fwd_cuda<input_t, weight_t>(params, stream);
        });
    });
}
void bwd() {
    DISPATCH_ITYPE_TWO(u.scalar_type(), "bwd", [&] {
        DISPATCH_WTYPE_CPLX(A.scalar_type(), "bwd", [&] {
            selective_scan_bwd_cuda<input_t, weight_t>(params, stream);
        });
    });
}
"""


def test_instantiations_come_from_the_dispatch_macros_around_each_call(anchor):
    assert anchor.referenced_instantiations(BINDING) == [
        ("float", "float"), ("float", "c10::complex<float>"), ("at::BFloat16", "float"),
        ("at::BFloat16", "c10::complex<float>")]
    assert anchor.referenced_instantiations(BINDING, "selective_scan_fwd_cuda") == [
        ("float", "float"), ("at::BFloat16", "float")]
    with pytest.raises(SystemExit, match="never calls selective_scan_bwd_cuda"):
        anchor.referenced_instantiations(BINDING.replace("selective_scan_bwd_cuda", "renamed"))
    no_macros = "void bwd() { selective_scan_bwd_cuda<input_t, weight_t>(params, stream); }"
    with pytest.raises(SystemExit, match="cannot tell which types"):
        anchor.referenced_instantiations(no_macros)


@pytest.mark.skipif(not (FETCHED / "csrc" / "selective_scan").is_dir(), reason="no fetched sources (make mamba-anchor)")
def test_the_real_binding_needs_what_upstreams_backward_files_would_have_defined(anchor):
    """The generated specializations replace the six selective_scan_bwd_*.cu files one for one."""
    source_dir = FETCHED / "csrc" / "selective_scan"
    pairs = anchor.referenced_instantiations((source_dir / "selective_scan.cpp").read_text())
    upstream = set()
    for path in source_dir.glob("selective_scan_bwd_*.cu"):
        for a, b in re.findall(r"template void selective_scan_bwd_cuda<([^,]+),\s*([^>]+)>", path.read_text()):
            upstream.add((a.strip(), b.strip().replace("complex_t", "c10::complex<float>")))
    assert len(pairs) == len(set(pairs)) == 6 and set(pairs) == upstream
    names = [p.name for p in anchor.forward_sources(source_dir)]
    assert names == ["selective_scan.cpp", "selective_scan_fwd_bf16.cu", "selective_scan_fwd_fp16.cu",
                     "selective_scan_fwd_fp32.cu"]


def test_forward_sources_leave_out_the_backward_files(anchor, tmp_path):
    with pytest.raises(SystemExit, match="lacks selective_scan.cpp"):
        anchor.forward_sources(tmp_path)
    for name in ("selective_scan.cpp", "selective_scan_fwd_fp32.cu", "selective_scan_fwd_bf16.cu",
                 "selective_scan_bwd_fp32_real.cu", "selective_scan_bwd_kernel.cuh", "selective_scan_fwd_kernel.cuh"):
        (tmp_path / name).write_text("")
    assert [p.name for p in anchor.forward_sources(tmp_path)] == [
        "selective_scan.cpp", "selective_scan_fwd_bf16.cu", "selective_scan_fwd_fp32.cu"]


def _cuda_include() -> Path | None:
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"]
    candidates += sorted(Path(torch.__file__).parents[1].glob("nvidia/*/include"))
    return next((c for c in candidates if (c / "cuda_runtime_api.h").is_file()), None)


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("nm") is None or _cuda_include() is None,
                    reason="needs g++, nm and the CUDA runtime headers")
def test_generated_backward_compiles_to_one_raising_definition_per_pair(anchor, tmp_path):
    from torch.utils.cpp_extension import include_paths

    pairs = [("float", "float"), ("at::Half", "c10::complex<float>"), ("at::BFloat16", "float")]
    source = anchor.backward_source(pairs)
    assert source.count("template <>") == 3 and source.count(anchor.FORWARD_ONLY_MESSAGE) == 3
    (tmp_path / "selective_scan.h").write_text("#pragma once\nstruct SSMParamsBwd { int batch; };\n")
    (tmp_path / "backward.cpp").write_text(source)
    includes = [f"-I{p}" for p in [tmp_path, *include_paths(), _cuda_include()]]
    subprocess.run(["g++", "-std=c++20", "-O0", "-c", *includes, str(tmp_path / "backward.cpp"), "-o",
                    str(tmp_path / "backward.o")], check=True, capture_output=True)
    symbols = subprocess.run(["nm", "-C", "--defined-only", str(tmp_path / "backward.o")], capture_output=True,
                             text=True, check=True).stdout
    defined = sorted(re.findall(r" T void selective_scan_bwd_cuda<(.+?)>\(SSMParamsBwd&", symbols))
    assert defined == sorted(["float, float", "c10::Half, c10::complex<float> ", "c10::BFloat16, float"])


def test_the_build_folder_is_emptied_when_it_was_built_with_something_else(anchor, tmp_path):
    out = tmp_path / "build"
    out.mkdir()
    (out / "selective_scan.o").write_text("object of an unknown build")
    key = {"torch": "2.11.0", "arch": "9.0"}
    anchor._start_build_dir(out, key)
    assert sorted(p.name for p in out.iterdir()) == [anchor.BUILD_KEY_FILE]
    (out / "selective_scan.o").write_text("object of this build")
    anchor._start_build_dir(out, dict(key))
    assert (out / "selective_scan.o").is_file()
    anchor._start_build_dir(out, {**key, "torch": "2.14.1"})
    assert not (out / "selective_scan.o").exists()
    assert json.loads((out / anchor.BUILD_KEY_FILE).read_text())["torch"] == "2.14.1"


def test_build_and_load_without_sources_or_module_are_refused_clearly(anchor, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="holds no fetched sources"):
        anchor.build(tmp_path, jobs=1)
    with pytest.raises(FileNotFoundError, match="no built vmamba2d_mamba_anchor module"):
        anchor.load(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert anchor.build_arch({"TORCH_CUDA_ARCH_LIST": "9.0"}) == "9.0"
    with pytest.raises(SystemExit, match="TORCH_CUDA_ARCH_LIST unset"):
        anchor.build_arch({})


# ------------------------------------------------------------------------------------------------
# bench
# ------------------------------------------------------------------------------------------------
def _bytes(batch: int, dim: int, side: int, size: int) -> int:
    """u, delta, y (batch, dim, L) and B, C (batch, 1, 16, L) in the input type, A (dim, 16), D and
    delta_bias (dim,) in fp32."""
    length = side * side
    return size * (3 * batch * dim * length + 2 * batch * 16 * length) + 4 * (dim * 16 + 2 * dim)


def test_channel_rows_take_the_smallest_power_of_two_batch_moving_the_minimum(bench):
    minimum = 64 * 2**20
    for side, expected in ((14, 512), (56, 32), (200, 4)):
        batch = bench.batch_for(side, bench.CHANNELS, minimum)
        assert batch == expected
        assert _bytes(batch, 128, side, 2) >= minimum > _bytes(batch // 2, 128, side, 2)
    rows = bench.cases(["channels", "paper"], (14, 200), minimum)
    assert [(s, sh.height, sh.batch, sh.dim, sh.groups, sh.nstate) for s, sh in rows] == [
        ("channels", 14, 512, 128, 1, 16), ("channels", 200, 4, 128, 1, 16),
        ("paper", 14, 8192, 1, 1, 16), ("paper", 200, 128, 1, 1, 16)]
    for _, shape in rows:
        for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
            assert bench.scan_bench.bytes_moved(shape, dtype) == _bytes(shape.batch, shape.dim, shape.height, size)


def test_row_arithmetic_and_table(bench):
    shape = bench.scan_bench.Shape("anchor", 32, 128, 1, 16, 56, 56)
    row = bench.Row("channels", shape, "bf16", backend="cuda", bytes=2 * 10**9, copy_bytes_per_s=4e12,
                    ms_1d=1.0, ms_2d=0.8, finite_1d=True, finite_2d=True)
    assert row.gbs(row.ms_1d) == pytest.approx(2000) and row.gbs(row.ms_2d) == pytest.approx(2500)
    assert row.copy_share(row.ms_2d) == pytest.approx(0.625)
    assert row.maps_per_s(row.ms_1d) == pytest.approx(32 * 128 * 1000)
    assert row.ratio == pytest.approx(1.25)
    slower = bench.Row("paper", shape, "fp32", backend="triton", bytes=2 * 10**9, copy_bytes_per_s=4e12,
                       ms_1d=1.0, ms_2d=2.0, finite_1d=True, finite_2d=True)
    broken = bench.Row("paper", shape, "fp32", backend="cuda", bytes=2 * 10**9, ms_1d=1.0, ms_2d=0.5,
                       finite_1d=True, finite_2d=False)
    skipped = bench.Row("paper", shape, "bf16", note="not measured: --max-seconds reached")
    lines = bench.format_table([row, slower, broken, skipped]).splitlines()
    assert len(lines) == 6 and lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert lines[2] == ("| channels | 56x56 | 32 x 128 | bf16 | cuda | 1907.3 | 4000 | 1.000 | 2000 | 50% | 4,096,000 "
                        "| 0.800 | 2500 | 62% | 5,120,000 | 1.25 | 0.50 | pass | yes, yes |  |")
    assert "| 0.50 | 0.50 | FAIL |" in lines[3]
    assert "| 2.00 | 0.50 | — (an output not finite) | yes, NO |" in lines[4]
    assert lines[5].endswith("| — | 0.50 | — | —, — | not measured: --max-seconds reached |")


class _RecordingAnchor:
    """Stands in for the built module: records its fwd calls, returns a non-finite y."""

    def __init__(self):
        self.calls = []

    def fwd(self, *args):
        self.calls.append(args)
        return [torch.full_like(args[0], float("nan")), None]


def test_a_row_calls_the_binding_and_our_scan_on_the_same_tensors(bench, monkeypatch):
    shape = bench.scan_bench.Shape("anchor", 2, 3, 1, 16, 4, 5)
    row = bench.Row("channels", shape, "fp32", bytes=bench.scan_bench.bytes_moved(shape, torch.float32))
    fake = _RecordingAnchor()
    seen = []
    real_scan = bench.selective_scan_2d

    def recording_scan(*args, **kwargs):
        seen.append((args, kwargs))
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(bench, "selective_scan_2d", recording_scan)
    bench.measure_row(row, fake, "torch", torch.device("cpu"), warmup=1, repeats=3)
    u, delta, A, B, C, D, z, delta_bias, softplus = fake.calls[0]
    assert (tuple(u.shape), tuple(delta.shape), tuple(A.shape), tuple(B.shape), tuple(C.shape)) == (
        (2, 3, 20), (2, 3, 20), (3, 16), (2, 1, 16, 20), (2, 1, 16, 20))
    assert D.shape == delta_bias.shape == (3,) and z is None and softplus is True
    args, kwargs = seen[0]
    assert all(a is b for a, b in zip(args[:7], (u, delta, A, B, C, D, delta_bias))) and args[7] is True
    assert kwargs == {"height": 4, "width": 5, "backend": "torch"}
    assert len(fake.calls) == len(seen) == 1 + 1 + 3  # the finiteness check, the warm-up, the repeats
    assert row.backend == "torch" and row.finite_1d is False and row.finite_2d is True
    assert row.ms_1d > 0 and row.ms_2d > 0 and row.copy_bytes_per_s > 0


def test_the_anchor_must_be_fetched_and_built(bench, anchor, tmp_path):
    assert "make mamba-anchor" in bench.anchor_problem(tmp_path)
    (tmp_path / anchor.INFO_FILE).write_text("{}")
    assert "not built" in bench.anchor_problem(tmp_path)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / f"{anchor.MODULE_NAME}.so").write_bytes(b"")
    assert bench.anchor_problem(tmp_path) is None


def test_without_a_gpu_the_bench_measures_nothing_and_says_why_in_one_line(tmp_path):
    out = tmp_path / "anchor.md"
    result = subprocess.run([sys.executable, str(TOOLS / "bench_anchor.py"), "--out", str(out)], capture_output=True,
                            text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), cwd=REPO)
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == ["bench_anchor: no CUDA device is visible; nothing measured."]
    assert not out.exists()
