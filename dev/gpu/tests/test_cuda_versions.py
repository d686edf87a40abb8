"""The v3-vs-earlier CUDA kernel comparison on the CPU: dev/gpu/cuda_baseline.py (export of an earlier
kernel from git, module lookup), dev/gpu/bench_cuda_versions.py (the calls it times, the table) and
gpu_check's comparison plan. Nothing is timed and no GPU result is made here."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.script_loading import load_gpu_tool

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def baseline():
    return load_gpu_tool("cuda_baseline")


@pytest.fixture(scope="module")
def versions():
    return load_gpu_tool("bench_cuda_versions")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def _is_git_checkout() -> bool:
    try:
        return _git("rev-parse", "--is-inside-work-tree") == "true"
    except (OSError, subprocess.CalledProcessError):
        return False


needs_git = pytest.mark.skipif(not _is_git_checkout(), reason="not a git checkout (an sdist or a copy)")


@needs_git
def test_export_writes_the_commits_kernel_sources_and_names_the_commit(baseline, tmp_path):
    head = _git("rev-parse", "HEAD")
    (tmp_path / "csrc" / "cuda").mkdir(parents=True)
    (tmp_path / "csrc" / "cuda" / "stale.cu").write_text("left from an earlier export")
    info = baseline.export("HEAD", tmp_path)
    assert info["commit"] == head and info["short"] == head[:7]
    assert baseline.read_info(tmp_path)["commit"] == head
    tracked = _git("ls-tree", "-r", "--name-only", "HEAD", "csrc/cuda").splitlines()
    exported = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "csrc").rglob("*") if p.is_file())
    assert exported == sorted(tracked)  # the stale file is gone
    for name in tracked:
        committed = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=REPO, capture_output=True, check=True).stdout
        assert (tmp_path / name).read_bytes() == committed, name
    units = sorted(Path(p).name for p in baseline.sources(tmp_path))
    # setup.py compiles the folder's own units into _C_cuda; emulation/ and entries/ are built apart
    top_level = [n for n in tracked if Path(n).parent == Path("csrc/cuda")]
    assert units == sorted(Path(n).name for n in top_level if n.endswith((".cpp", ".cu")))
    assert baseline.built_module(tmp_path) is None


@needs_git
def test_the_default_baseline_is_a_commit_of_this_history(baseline):
    if _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("shallow clone: the baseline commit may lie beyond its history")
    full = _git("rev-parse", "--verify", f"{baseline.BASELINE_COMMIT}^{{commit}}")
    files = _git("ls-tree", "-r", "--name-only", full, baseline.SOURCE_FOLDER).splitlines()
    assert "csrc/cuda/selective_scan_2d_cuda.cpp" in files
    assert _git("merge-base", "--is-ancestor", full, "HEAD") == ""  # raises when it is not an ancestor


def test_unknown_commits_and_missing_exports_are_refused_clearly(baseline, tmp_path):
    if _is_git_checkout():
        with pytest.raises(SystemExit, match="cannot resolve commit 'no-such-commit'"):
            baseline.export("no-such-commit", tmp_path)
    with pytest.raises(SystemExit, match="holds no export"):
        baseline.build(tmp_path, jobs=1)
    with pytest.raises(FileNotFoundError, match="no built vmamba2d_cuda_baseline module"):
        baseline.load(tmp_path)


class _RecordingKernel:
    """Stands in for a kernel module: records the binding calls bench_cuda_versions makes."""

    def __init__(self):
        self.calls = []

    def forward(self, *args):
        self.calls.append(("forward", args))
        return ["y", "carry_h", "carry_v"]

    def backward(self, *args):
        self.calls.append(("backward", args))
        return []


def test_timed_steps_call_the_bindings_with_the_carries_of_their_own_forward(versions):
    names = ("u", "delta", "A", "B", "C", "D", "delta_bias")
    inputs = {name: name for name in names}
    kernel = _RecordingKernel()
    forward, train = versions.kernel_steps(kernel, inputs, "dy", 7, 9)
    assert forward() == "y"
    assert kernel.calls == [("forward", (*names, True, 7, 9, False, False))]
    kernel.calls.clear()
    train()
    assert kernel.calls == [("forward", (*names, True, 7, 9, False, True)),
                            ("backward", (*names, True, 7, 9, "dy", "carry_h", "carry_v"))]


def test_table_gives_baseline_over_current_speedups_and_their_geometric_mean(versions):
    scan_bench = versions.scan_bench
    shape = scan_bench.Shape("model", 128, 384, 4, 1, 56, 56)
    rows = [
        versions.Comparison(shape, "fp32", fwd_ms=1.0, train_ms=4.0, base_fwd_ms=2.0, base_train_ms=6.0, y_max_diff=0.0),
        versions.Comparison(shape, "bf16", fwd_ms=1.0, train_ms=2.0, base_fwd_ms=8.0, base_train_ms=6.0, y_max_diff=1e-3),
        versions.Comparison(shape, "fp16", note="not measured: --max-seconds reached"),
    ]
    assert rows[0].fwd_speedup == 2.0 and rows[0].train_speedup == 1.5 and rows[2].fwd_speedup is None
    table = versions.format_table(rows, "7bdd96f")
    assert "| fwd ms 7bdd96f |" in table.splitlines()[0]
    assert "| model 56x56 x 384 ch | fp32 | 1.000 | 2.000 | 2.00x | 4.000 | 6.000 | 1.50x | 0.000000 |  |" in table
    assert "| fp16 | — | — | —x |" in table
    assert "over 2 rows: fwd 4.00x, fwd+bwd 2.12x" in table  # sqrt(2 * 8), sqrt(1.5 * 3)


def test_without_a_gpu_the_comparison_measures_nothing(versions, capsys, monkeypatch):
    monkeypatch.setattr(versions.torch.cuda, "is_available", lambda: False)
    assert versions.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out


@pytest.fixture(scope="module")
def gpu_check():
    return load_gpu_tool("gpu_check")


def test_comparison_plan_builds_both_kernels_for_this_gpu_and_fits_the_run(gpu_check, tmp_path):
    env = gpu_check.Environment(capability="9.0")
    steps = gpu_check.compare_plan("python3", env, tmp_path, 16, tmp_path / "base")
    assert [s.name for s in steps] == ["build", "build-baseline", "bench-versions"]
    assert all(s.env == {"TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "16", "VMAMBA2D_NVCC_BUILD": "1"} for s in steps[:2])
    assert steps[1].command[1:5] == ["dev/gpu/cuda_baseline.py", "build", "--dir", str(tmp_path / "base")]
    assert steps[2].command[1] == "dev/gpu/bench_cuda_versions.py" and steps[2].table is not None
    assert all(Path(gpu_check.REPO, s.command[1]).is_file() for s in steps)
    default_budget = gpu_check.parse_args([]).budget_s
    assert sum(s.budget_s for s in steps) <= default_budget - gpu_check.REPORT_RESERVE_S


def test_comparison_without_an_export_says_how_to_make_one(gpu_check, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "probe_environment", lambda python, commit: gpu_check.Environment())
    assert gpu_check.main(["--compare-baseline", str(tmp_path / "missing"), "--out-dir", str(tmp_path)]) == 2
    assert "make cuda-baseline" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
