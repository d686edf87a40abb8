#!/usr/bin/env python3
"""One command for a GPU machine: CUDA tests, compute-sanitizer, benchmarks, one report.

Meant for a machine with its own python3 and torch, no virtual environment and no network (run it
as ``make gpu-check``, which calls this file with ``python3``). It measures the NVRTC path, what a
pip install runs: no nvcc build unless asked for (--nvcc-build). Steps, in order, each with a time
budget (seconds) so that the whole run ends within --budget-s (default 585, inside a 10-minute
limit); a step that would start with less time left than it needs is skipped, one that runs past
its budget is stopped, and the report says so:

    precompile           python3 -m vmamba2d.ops.precompile --arch <this GPU's> --jobs <jobs>: the NVRTC
                         kernels the model launches, into the kernel cache, so the steps that run the
                         NVRTC path (bench-v4, the model benchmark) do not time first-use compiles;
                         beside it dev/gpu/jit_prebuild.py: the NVRTC host driver and the CPU kernel
                         (C++ compiler, no nvcc) into torch's extension cache, so that no later step
                         JIT-compiles them inside its own budget
    bench-v4             dev/gpu/bench_v4.py: the v4 forwards against v3 on the NVRTC path, the
                         four-route rows first (the most wanted measurement; the biggest budget)
    tests                pytest -m cuda -v on the test files that hold cuda-marked tests, the
                         GPU-dispatch ones first (files whose imports fail, e.g. for a package
                         missing here, are reported as collection errors, not run); the report lists
                         the failed test ids, and the test running when a time-out stopped it
    triton-reverse-scan  dev/gpu/triton_reverse_scan_smoke.py: Triton's reverse associative scan on
                         a 4-D block with 4 and 8 warps against a Python loop (open upstream bug
                         report; the Triton backward depends on it)
    bench-scan           benchmarks/bench_scan.py --device cuda (shapes and targets: docs/benchmarks.md)
    bench-cross-scan     benchmarks/bench_cross_scan.py --device cuda: the four-route op vs per-route
                         copies on the cuda and triton backends
    bench-model-*        benchmarks/bench_model.py --device cuda, fp32 and bf16 autocast, batch 128:
                         vmamba2d_tiny vs vmamba_tiny and convnext_tiny, inference and training, on
                         the NVRTC kernels (VMAMBA2D_CUDA_KERNELS=nvrtc: what a pip install runs,
                         v4 forwards where the rule picks them)
    sanitize-<tool>      dev/gpu/cuda_sanitize.sh with memcheck, racecheck, synccheck, initcheck, last
                         (slowest, and a hang there must not cost the measurements); memcheck and
                         initcheck with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so they see every allocation;
                         racecheck and initcheck on the CUDA kernels only (racecheck's Triton hazards
                         are upstream's, triton-lang/triton#7264; initcheck checks every kernel, no
                         filter, on three cases: see the script)

With --nvcc-build, first:

    build                VMAMBA2D_NVCC_BUILD=1 python3 setup.py build_ext --inplace (the nvcc build beside
                         the NVRTC path, for make gpu-nvrtc), TORCH_CUDA_ARCH_LIST = this GPU's arch
    bench-versions       (after the model benchmarks) only when build/cuda-baseline (--baseline) holds
                         an earlier kernel exported by dev/gpu/cuda_baseline.py (make cuda-baseline):
                         that kernel builds beside this checkout's during the build step, and
                         dev/gpu/bench_cuda_versions.py times both on the model shapes (the v3-vs-v2 ratio)

Budgets per step (BUDGETS_S) add up to less than the default run budget; the nvcc build's
(NVCC_BUDGETS_S) do not fit beside them, so with --nvcc-build the last steps get what is left or
are skipped (--dry-run says so; --skip frees time).

The report (benchmarks/gpu-check-<date>-<gpu>-<commit>.md) holds the GPU name, driver, torch,
triton, commit and date, each step's result, time and output tail, and the benchmark tables. It is
rewritten after every step, so a run that is cut off still leaves what it measured.

    python3 dev/gpu/gpu_check.py                      # everything
    python3 dev/gpu/gpu_check.py --dry-run            # print the plan (steps, budgets, commands)
    python3 dev/gpu/gpu_check.py --copy-to DIR        # also copy the report into DIR
    python3 dev/gpu/gpu_check.py --nvcc-build         # also the nvcc build (for make gpu-nvrtc after it)

A second, separate run (``make gpu-compare``, its own 10-minute call) times this checkout's CUDA
kernel against an earlier version on the same tensors: ``--compare-baseline DIR`` builds the
kernel that ``dev/gpu/cuda_baseline.py export`` wrote to DIR (by default kernel v2; export where git
works, e.g. ``make cuda-baseline``, and carry ``build/cuda-baseline`` to the GPU machine) and runs
``dev/gpu/bench_cuda_versions.py``; its report is ``benchmarks/gpu-compare-<date>-<gpu>-<commit>.md``
with the speedup per model shape and dtype.

Another separate run (``make gpu-anchor``, its own 10-minute call) times our 2D scan against
mamba_ssm's 1D selective scan (issue 39's anchor): ``--anchor DIR`` builds this checkout's kernel
and, beside it, the forward-only anchor from the sdist sources ``dev/gpu/mamba_anchor.py fetch``
put in DIR (``make mamba-anchor`` where the network works; carry ``build/mamba-anchor``), then runs
``dev/gpu/bench_anchor.py``; its report is ``benchmarks/gpu-anchor-<date>-<gpu>-<commit>.md``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
CUDA_MARK = "pytest.mark.cuda"  # how a test file marks its GPU tests (pytest.ini: cuda)
# The tests step runs these first: the NVRTC path's dispatch to the v4 forwards and the CUDA op's GPU tests.
GPU_TESTS_FIRST = ("tests/ops/compiled/test_cuda_v4_dispatch.py", "tests/ops/compiled/test_scan_cuda.py")
MODEL_BENCH_MODELS = ("vmamba2d_tiny", "vmamba_tiny", "convnext_tiny")
OUTPUT_TAIL_LINES = 40
REPORT_RESERVE_S = 10  # kept back from the last step for writing the report
DEFAULT_BASELINE = REPO / "build" / "cuda-baseline"  # where `make cuda-baseline` exports kernel v2
BASELINE_INFO = "BASELINE.json"  # the file an export holds (dev/gpu/cuda_baseline.py INFO_FILE)
ANCHOR_INFO = "ANCHOR.json"  # the file a fetch of the anchor writes (dev/gpu/mamba_anchor.py INFO_FILE)


@dataclass
class Step:
    """One command of the check. ``budget_s`` caps its run; it is skipped when less than
    ``min_s`` is left. ``table`` is a markdown file the step writes, embedded in the report."""

    name: str
    command: list[str]
    budget_s: float
    min_s: float
    env: dict = field(default_factory=dict)
    table: Optional[Path] = None
    meanings: dict = field(default_factory=dict)  # exit code -> result text other than FAIL
    time_option: Optional[str] = None  # option that tells the command its own time limit (seconds)
    time_margin_s: float = 30  # the time_option's limit is the step's timeout less this (time to write its table)
    # a second command run beside this one, within the same budget (its exit code does not decide
    # the step's result; a later step that needs what it made fails if it did not)
    companion: Optional[list[str]] = None
    # filled in by run_step
    result: str = "not run"
    seconds: float = 0.0
    output: str = ""
    companion_result: str = ""


@dataclass
class Environment:
    gpu: str = "unknown"
    capability: str = "unknown"
    driver: str = "unknown"
    memory: str = "unknown"
    python: str = sys.version.split()[0]
    torch: str = "not importable"
    cuda: str = "unknown"
    triton: str = "not importable"
    commit: str = "unknown"
    date: str = ""


# ------------------------------------------------------------------------------------------------
# environment
# ------------------------------------------------------------------------------------------------
_PROBE = """
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", memory=f"{p.total_memory / 2**30:.0f} GiB")
try:
    import triton
    info["triton"] = triton.__version__
except Exception as err:
    info["triton"] = f"not importable ({type(err).__name__})"
print(json.dumps(info))
"""


def _run_quiet(command: list[str], timeout: float = 60) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit(explicit: Optional[str]) -> str:
    """Short commit (+ a mark when tracked files differ), ``explicit`` when given, else "unknown"."""
    if explicit:
        return explicit
    commit = _run_quiet(["git", "rev-parse", "--short", "HEAD"])
    if not commit:
        return "unknown"
    dirty = _run_quiet(["git", "status", "--porcelain", "--untracked-files=no"])
    return commit + ("-dirty" if dirty else "")


def probe_environment(python: str, commit: Optional[str]) -> Environment:
    """GPU, driver and library versions, read in a child process (this one never holds a GPU context)."""
    env = Environment(commit=git_commit(commit),
                      date=f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    smi = _run_quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    env.driver = smi.splitlines()[0].strip() if smi else "unknown (nvidia-smi not answering)"
    probe = _run_quiet([python, "-c", _PROBE], timeout=120)
    if probe:
        info = json.loads(probe.splitlines()[-1])
        env.torch, env.cuda, env.triton = info["torch"], str(info["cuda"]), info["triton"]
        if info["gpu"]:
            env.gpu, env.capability, env.memory = info["gpu"], info["capability"], info["memory"]
    env.python = _run_quiet([python, "-c", "import platform; print(platform.python_version())"]) or env.python
    return env


def gpu_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3" (for file names)."""
    words = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return words or "gpu"


def report_path(out_dir: Path, env: Environment, kind: str = "gpu-check") -> Path:
    stamp = env.date.replace("-", "").replace(":", "").replace(" UTC", "").replace(" ", "-")
    return out_dir / f"{kind}-{stamp}-{gpu_slug(env.gpu)}-{re.sub(r'[^A-Za-z0-9-]', '', env.commit)}.md"


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------
def cuda_test_files() -> list[str]:
    """The test files under tests/ that hold a cuda-marked test (the others run nothing under
    ``-m cuda`` and only cost their collection), GPU_TESTS_FIRST first, the rest in path order with
    Triton's last (its kernels compile at first use, most of the step's time)."""
    found = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "tests").rglob("test_*.py"))
             if CUDA_MARK in p.read_text(errors="replace")]
    first = [f for f in GPU_TESTS_FIRST if f in found]
    rest = sorted((f for f in found if f not in first), key=lambda f: ("/triton/" in f, f))
    return first + rest


# Sanitizers that track allocations see through torch's caching allocator only when it is off.
UNCACHED_SANITIZERS = ("memcheck", "initcheck")
# Per-step budgets (seconds); they add up to less than the run's default budget (585 s, itself
# inside a 10-minute limit) minus REPORT_RESERVE_S, so that a run on a GPU reaches the end.
# Measured on an H200. 2026-11-28 (benchmarks/gpu-followup-20261128-h200-798a329.md): the Triton smoke
# test 6 s, cross-scan 27 s, each model benchmark 55-60 s, memcheck 26 s, synccheck 14 s; initcheck on
# both backends did not finish in 125 s. 2026-11-29 (benchmarks/gpu-check-20261129-1903-h200-0c5e707.md):
# - the nvcc build did not finish in 110 s and nothing after it used it (the measured path is NVRTC):
#   it left the default plan (--nvcc-build), its time went to bench-v4 and tests;
# - precompile 21 s; bench-v4 (35 s) timed one row, most of that compiling the host driver at first
#   use, and the tests were stopped at 95 s, most likely after JIT-building the CPU kernel in a test: both
#   C++ parts now build beside precompile (dev/gpu/jit_prebuild.py; 104 s together on 2 shared cores,
#   in parallel there), hence its 50 s;
# - bench-scan's 10 s of rows (40 s less a 30 s margin) held 4 rows: a 15 s margin now;
# - racecheck reached the Triton cases at 20 s (now CUDA only); initcheck spent its 20 s printing
#   reports most likely caused by its kernel filter (now unfiltered, on 3 cases).
BUDGETS_S = {"precompile": 50, "bench-v4": 120, "tests": 110, "triton-reverse-scan": 10, "bench-scan": 40,
             "bench-cross-scan": 25, "bench-model-fp32": 60, "bench-model-bf16": 60, "sanitize-memcheck": 30,
             "sanitize-racecheck": 20, "sanitize-synccheck": 15, "sanitize-initcheck": 30}
# With --nvcc-build only: the nvcc build (102 s with 12 jobs on 2026-11-28, not finished in 110 s with
# 16 on 2026-11-29) and, with an exported earlier kernel, the v3-vs-v2 timing (20 s).
NVCC_BUDGETS_S = {"build": 140, "bench-versions": 20}
# bench-scan writes its table only at its end, after the measurement running at --max-seconds (a
# Triton compile or a torch-backend row: seconds) and its start-up before the clock (imports): 15 s.
BENCH_SCAN_MARGIN_S = 15
# Backends each sanitizer checks (dev/gpu/cuda_sanitize.sh's BACKENDS). racecheck: the CUDA kernels
# only -- Triton's backward has known hazards in Triton's own reduction code (triton-lang/triton#7264,
# which the script tells apart: BACKENDS="cuda triton" TOOLS=racecheck dev/gpu/cuda_sanitize.sh on a
# machine with time), and its cases took the rest of a 20 s budget on 2026-11-29.
SANITIZER_BACKENDS = {"memcheck": "cuda triton", "racecheck": "cuda", "synccheck": "cuda triton",
                      "initcheck": "cuda"}
SANITIZER_MEANINGS = {2: "not run (no GPU backend or no compute-sanitizer)",
                      4: "hazards only in Triton's own code (triton-lang/triton#7264), none in ours"}
# The comparison run (--compare-baseline): this checkout's kernel against an earlier one.
COMPARE_BUDGETS_S = {"build": 140, "build-baseline": 200, "bench-versions": 180}
# The anchor run (--anchor): this checkout's kernel and the forward-only mamba_ssm scan built side by
# side (ours 102 s with 12 jobs on the H200; the anchor's five files took 120 s with 2 jobs on a 2-core
# machine, not yet timed on a GPU machine), then the anchor benchmark (12 rows, each a few
# hundred milliseconds of timed calls plus input setup; not measured yet).
ANCHOR_BUDGETS_S = {"build": 240, "bench-anchor": 300}
ANCHOR_MEANINGS = {2: "not run (no GPU, or the anchor not built)"}


def _baseline_build(python: str, baseline: Path, jobs: int) -> list[str]:
    return [python, "dev/gpu/cuda_baseline.py", "build", "--dir", str(baseline), "--jobs", str(jobs)]


def _versions_bench(python: str, baseline: Path, out: Path) -> list[str]:
    return [python, "dev/gpu/bench_cuda_versions.py", "--baseline", str(baseline), "--families", "model",
            "--dtypes", "fp32", "bf16", "--out", str(out)]


VERSIONS_MEANINGS = {2: "not run (no GPU, or a kernel without an image for it)"}


def plan(python: str, env: Environment, work: Path, jobs: int, baseline: Optional[Path] = None,
         nvcc_build: bool = False) -> list[Step]:
    """The steps for this machine, in first-run order (what must work before what is worth timing;
    the slow sanitizers last), with their budgets (seconds). With ``nvcc_build`` the nvcc build
    comes first, and with ``baseline`` too (a folder that ``dev/gpu/cuda_baseline.py export``
    wrote) the earlier kernel builds beside it and a step times the two against each other."""
    steps = []
    if nvcc_build:
        steps.append(Step("build", [python, "setup.py", "build_ext", "--inplace"], budget_s=NVCC_BUDGETS_S["build"],
                          min_s=60, env={"TORCH_CUDA_ARCH_LIST": env.capability, "MAX_JOBS": str(jobs),
                                         "VMAMBA2D_NVCC_BUILD": "1"},
                          # the earlier kernel with a quarter of the jobs, so this checkout's build finishes first
                          companion=_baseline_build(python, baseline, max(1, jobs // 4)) if baseline else None))
    steps += [
        # the NVRTC kernels the model launches, compiled in parallel into the kernel cache, so that the
        # benchmarks below (each NVRTC compile at first use is serial, ~2-4 s) time kernels, not compiles;
        # beside it the C++ parts a checkout JIT-compiles at first use (the host driver, the CPU kernel), into
        # torch's extension cache for every later step (nothing to do where a finished nvcc build made them)
        Step("precompile", [python, "-m", "vmamba2d.ops.precompile", "--arch", env.capability.replace(".", ""),
                            "--jobs", str(jobs)], budget_s=BUDGETS_S["precompile"], min_s=10,
             env={"MAX_JOBS": str(jobs)}, meanings={2: "not run (no NVRTC)"},
             companion=[python, "dev/gpu/jit_prebuild.py"]),
        # first after it: the v4 forward is what the next GPU run must measure (its table is written
        # after every row, so it keeps only a 7 s margin of its budget)
        Step("bench-v4", [python, "dev/gpu/bench_v4.py", "--out", str(work / "bench_v4.md"),
                          "--max-seconds", str(BUDGETS_S["bench-v4"] - 7)],
             budget_s=BUDGETS_S["bench-v4"], min_s=20, table=work / "bench_v4.md",
             meanings={2: "not run (no GPU or no NVRTC)"}),
        # -v: one line per test as it ends, so a step stopped by its budget still names its failures
        Step("tests", [python, "-m", "pytest", "-m", "cuda", "-v", "--tb=short", "-p", "no:cacheprovider",
                       "--continue-on-collection-errors", *cuda_test_files()], budget_s=BUDGETS_S["tests"],
             min_s=30, meanings={5: "no cuda-marked tests collected"}),
        Step("triton-reverse-scan", [python, "dev/gpu/triton_reverse_scan_smoke.py"],
             budget_s=BUDGETS_S["triton-reverse-scan"], min_s=5, meanings={2: "not run (no GPU or no Triton)"}),
        Step("bench-scan", [python, "benchmarks/bench_scan.py", "--device", "cuda", "--warmup", "2", "--repeats", "5",
                            "--out", str(work / "bench_scan.md")], budget_s=BUDGETS_S["bench-scan"], min_s=30,
             table=work / "bench_scan.md", time_option="--max-seconds", time_margin_s=BENCH_SCAN_MARGIN_S),
        # the four-route op vs its routes one by one on copies (cuda, triton), stages 1 and 3 of the tiny model
        Step("bench-cross-scan", [python, "benchmarks/bench_cross_scan.py", "--device", "cuda", "--backends", "cuda",
                                  "triton", "--scans", "2d", "--stages", "0", "2", "--repeats", "3",
                                  "--out", str(work / "bench_cross_scan.md")],
             budget_s=BUDGETS_S["bench-cross-scan"], min_s=15, table=work / "bench_cross_scan.md"),
    ]
    for precision in ("fp32", "bf16"):
        out = work / f"bench_model_{precision}.md"
        name = f"bench-model-{precision}"
        steps.append(Step(name, [python, "benchmarks/bench_model.py", "--device", "cuda", "--models", *MODEL_BENCH_MODELS,
                                 "--precisions", precision, "--batch-sizes", "128", "--iters", "5", "--warmup", "2",
                                 "--out", str(out)], budget_s=BUDGETS_S[name], min_s=30, table=out,
                          env={"VMAMBA2D_CUDA_KERNELS": "nvrtc"}))
    if nvcc_build and baseline is not None:
        out = work / "bench_cuda_versions.md"
        steps.append(Step("bench-versions", _versions_bench(python, baseline, out),
                          budget_s=NVCC_BUDGETS_S["bench-versions"], min_s=20, table=out,
                          time_option="--max-seconds", meanings=VERSIONS_MEANINGS))
    for tool in SANITIZER_TOOLS:
        name = f"sanitize-{tool}"
        tool_env = {"TOOLS": tool, "PYTHON": python, "BACKENDS": SANITIZER_BACKENDS[tool]}
        if tool in UNCACHED_SANITIZERS:
            tool_env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        steps.append(Step(name, ["bash", "dev/gpu/cuda_sanitize.sh"], budget_s=BUDGETS_S[name], min_s=10, env=tool_env,
                          meanings=SANITIZER_MEANINGS))
    return steps


def compare_plan(python: str, env: Environment, work: Path, jobs: int, baseline: Path) -> list[Step]:
    """The comparison run: build this checkout's kernel and the exported earlier one
    (dev/gpu/cuda_baseline.py) for this GPU, then time both on the model shapes
    (dev/gpu/bench_cuda_versions.py)."""
    arch = {"TORCH_CUDA_ARCH_LIST": env.capability, "MAX_JOBS": str(jobs), "VMAMBA2D_NVCC_BUILD": "1"}
    out = work / "bench_cuda_versions.md"
    return [
        Step("build", [python, "setup.py", "build_ext", "--inplace"], budget_s=COMPARE_BUDGETS_S["build"], min_s=60,
             env=arch),
        Step("build-baseline", _baseline_build(python, baseline, jobs),
             budget_s=COMPARE_BUDGETS_S["build-baseline"], min_s=60, env=arch),
        Step("bench-versions", _versions_bench(python, baseline, out),
             budget_s=COMPARE_BUDGETS_S["bench-versions"], min_s=30, table=out, time_option="--max-seconds",
             meanings=VERSIONS_MEANINGS),
    ]


def _anchor_build(python: str, anchor: Path, jobs: int) -> list[str]:
    return [python, "dev/gpu/mamba_anchor.py", "build", "--dir", str(anchor), "--jobs", str(jobs)]


def anchor_plan(python: str, env: Environment, work: Path, jobs: int, anchor: Path) -> list[Step]:
    """The anchor run: build this checkout's kernel with the forward-only mamba_ssm scan from the
    sources in ``anchor`` beside it (dev/gpu/mamba_anchor.py), then time the two
    (dev/gpu/bench_anchor.py)."""
    arch = {"TORCH_CUDA_ARCH_LIST": env.capability, "MAX_JOBS": str(jobs), "VMAMBA2D_NVCC_BUILD": "1"}
    out = work / "bench_anchor.md"
    return [
        # the anchor has five files: a quarter of the jobs builds it within our build's time
        Step("build", [python, "setup.py", "build_ext", "--inplace"], budget_s=ANCHOR_BUDGETS_S["build"], min_s=60,
             env=arch, companion=_anchor_build(python, anchor, max(1, jobs // 4))),
        Step("bench-anchor", [python, "dev/gpu/bench_anchor.py", "--anchor", str(anchor), "--out", str(out)],
             budget_s=ANCHOR_BUDGETS_S["bench-anchor"], min_s=30, table=out, time_option="--max-seconds",
             meanings=ANCHOR_MEANINGS),
    ]


# ------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------
def _stream(pipe, log: list[str], prefix: str) -> None:
    for line in iter(pipe.readline, ""):
        log.append(line)
        sys.stdout.write(f"[{prefix}] {line}")
        sys.stdout.flush()


def _start(command: list[str], env: dict, lines: list[str], prefix: str):
    """(process, reader thread) of ``command`` in its own process group, its output into ``lines``."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    reader = threading.Thread(target=_stream, args=(process.stdout, lines, prefix), daemon=True)
    reader.start()
    return process, reader


def _finish(process: subprocess.Popen, reader: threading.Thread, timeout: float) -> Optional[int]:
    """The exit code, or None when ``process`` outlived ``timeout`` (its group is then stopped)."""
    try:
        code = process.wait(timeout=max(timeout, 0))
    except subprocess.TimeoutExpired:
        _stop_group(process)
        code = None
    reader.join(timeout=5)
    return code


def run_step(step: Step, timeout: float) -> None:
    """Run ``step`` (and its companion beside it) for at most ``timeout`` seconds (whole process
    groups are stopped after), recording result, wall time and output."""
    lines: list[str] = []
    companion_lines: list[str] = []
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **step.env)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    companion = None
    try:
        if step.companion:
            companion = _start(step.companion, env, companion_lines, f"{step.name}:companion")
        main = _start(step.command, env, lines, step.name)
    except OSError as err:
        step.result, step.output = f"FAIL (could not start: {err})", ""
        if companion is not None:
            _finish(*companion, timeout=0)
        return
    code = _finish(*main, timeout=timeout)
    if code is None:
        step.result = f"timed out (stopped after its {timeout:.0f} s budget)"
    else:
        step.result = "pass" if code == 0 else step.meanings.get(code, f"FAIL (exit {code})")
    if companion is not None:
        companion_code = _finish(*companion, timeout=timeout - (time.monotonic() - start))
        step.companion_result = ("timed out" if companion_code is None else
                                 "pass" if companion_code == 0 else f"FAIL (exit {companion_code})")
    step.seconds = time.monotonic() - start
    step.output = "".join(lines) + "".join(f"[companion] {line}" for line in companion_lines)


def _stop_group(process: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_all(steps: list[Step], budget_s: float, on_step_done) -> None:
    """Each step gets min(its budget, time left); steps needing more than what is left are skipped."""
    deadline = time.monotonic() + budget_s
    for step in steps:
        left = deadline - time.monotonic() - REPORT_RESERVE_S
        if left < step.min_s:
            step.result = f"skipped (time: {max(left, 0):.0f} s left of the run's budget, needs >= {step.min_s:.0f} s)"
        else:
            timeout = min(step.budget_s, left)
            if step.time_option:  # leave it time to write its table before it is stopped
                step.command += [step.time_option, f"{max(timeout - step.time_margin_s, 10):.0f}"]
            print(f"== {step.name} (budget {timeout:.0f} s): {' '.join(step.command)}", flush=True)
            run_step(step, timeout)
        on_step_done()


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------
def _tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(kept).replace("```", "'''")


def _highlights(step: Step) -> list[str]:
    """Lines worth quoting above the tail: pytest's summary, sanitizer error summaries."""
    wanted = re.compile(r"(ERROR SUMMARY|RACECHECK SUMMARY|^=+ .*(passed|failed|error|skipped).* =+$"
                        r"|^(FAILED|ERROR) |backend \w+: )")
    return [line for line in step.output.splitlines() if wanted.search(line)][:30]


# pytest's lines naming a test that did not pass: -v's "<id> FAILED [ 40%]" as each test ends, and the
# short summary's "FAILED <id> - <message>" / "ERROR <id>" (a collection error names the file alone).
_VERBOSE_FAILURE = re.compile(r"^(?P<id>\S+\.py::\S.*?) (?:FAILED|ERROR)(?: |$)")
_SUMMARY_FAILURE = re.compile(r"^(?:FAILED|ERROR) (?P<id>\S.*?)(?: - .*)?$")
_COLLECTION_ERROR = re.compile(r"^_+ ERROR collecting (?P<id>\S+) _+$")
# -v's line of a test that started: its id, then (once it ends) the outcome.
_VERBOSE_START = re.compile(r"^(?P<id>\S+\.py::\S.*?)(?: (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b.*)?$")


def failed_tests(output: str) -> list[str]:
    """The ids of the tests (or files, for collection errors) pytest reported as failed or erroring
    in ``output``, each once, in the order first named; from -v's per-test lines, so they are there
    even when the run was stopped before its summary."""
    found: dict[str, None] = {}
    for line in output.splitlines():
        match = (_VERBOSE_FAILURE.match(line) or _SUMMARY_FAILURE.match(line)
                 or _COLLECTION_ERROR.match(line.strip()))
        if match:
            found.setdefault(match["id"], None)
    return list(found)


def unfinished_test(output: str) -> Optional[str]:
    """The id of the test pytest -v had started and not finished when ``output`` ends (the one a
    time-out stopped), else None."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    match = _VERBOSE_START.match(lines[-1])
    return match["id"] if match and not match["outcome"] else None


def _companion_label(step: Step) -> str:
    return " ".join(Path(part).name if part.endswith(".py") else part for part in step.companion[1:3])


def format_report(env: Environment, steps: list[Step], budget_s: float, started: float, finished: bool,
                  command: str) -> str:
    elapsed = time.monotonic() - started
    lines = [
        f"# GPU check: {env.gpu}, {env.date}",
        "",
        f"- GPU: {env.gpu} (compute capability {env.capability}, {env.memory}), driver {env.driver}",
        f"- software: python {env.python}, torch {env.torch} (CUDA {env.cuda}), triton {env.triton}",
        f"- commit: {env.commit}",
        f"- date: {env.date}",
        f"- command: `{command}`; run budget {budget_s:.0f} s; wall time so far {elapsed:.0f} s"
        + ("" if finished else " (run still in progress or cut off: later steps missing)"),
        "",
        "| step | result | seconds | budget s |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {s.name} | {s.result}{f' (beside it, {_companion_label(s)}: {s.companion_result})' if s.companion_result else ''}"
              f" | {s.seconds:.0f} | {s.budget_s:.0f} |" for s in steps]
    for step in steps:
        lines += ["", f"## {step.name}: {step.result}", "", f"`{' '.join(step.command)}`"
                  + (f" with {' '.join(f'{k}={v}' for k, v in step.env.items())}" if step.env else "")]
        if step.table is not None and step.table.is_file():
            body = step.table.read_text().strip().splitlines()
            lines += [""] + [line.replace("# ", "### ", 1) if line.startswith("# ") else line for line in body]
        highlights = _highlights(step)
        if highlights:
            lines += ["", "Summary lines:", ""] + [f"    {h}" for h in highlights]
        failed = failed_tests(step.output)
        if failed:
            lines += ["", f"Failed tests ({len(failed)}):", ""] + [f"    {test}" for test in failed]
        stopped_in = unfinished_test(step.output) if step.result.startswith("timed out") else None
        if stopped_in:
            lines += ["", f"Stopped while running: `{stopped_in}`"]
        if step.output:
            lines += ["", f"Output (last {OUTPUT_TAIL_LINES} lines):", "", "```", _tail(step.output), "```"]
    return "\n".join(lines) + "\n"


def write_report(path: Path, text: str, copy_to: Optional[Path]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy_to / path.name)


def budget_note(steps: list[Step], budget_s: float) -> str:
    """One line: the steps' budgets against the run's (less the report's reserve), and what happens
    when they do not fit."""
    total, room = sum(s.budget_s for s in steps), budget_s - REPORT_RESERVE_S
    if total <= room:
        return f"step budgets add up to {total:.0f} s of the run's {room:.0f} s (report reserve excluded)"
    return (f"step budgets add up to {total:.0f} s, more than the run's {room:.0f} s (report reserve excluded): "
            "the last steps get what is left or are skipped (--skip frees time)")


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=585, help="the whole run, seconds")
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks", help="where the report goes")
    parser.add_argument("--copy-to", type=Path, help="also copy the report into this folder")
    parser.add_argument("--commit", help="commit to name in the report when git is unavailable here")
    parser.add_argument("--skip", nargs="+", default=[], help="step names to leave out (e.g. bench-model-bf16)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="parallel compile jobs")
    parser.add_argument("--nvcc-build", action="store_true",
                        help="also build the nvcc extension first (VMAMBA2D_NVCC_BUILD=1, for make gpu-nvrtc after "
                             "the check); the steps measure the NVRTC path either way")
    parser.add_argument("--baseline", type=Path, metavar="DIR", default=DEFAULT_BASELINE,
                        help="with --nvcc-build: an earlier kernel exported by `dev/gpu/cuda_baseline.py export` "
                             "(make cuda-baseline): when DIR holds one, it builds beside this checkout's and "
                             "bench-versions times both (default: %(default)s)")
    parser.add_argument("--compare-baseline", type=Path, metavar="DIR",
                        help="instead of the check: time this checkout's CUDA kernel against the earlier one "
                             "exported to DIR by `dev/gpu/cuda_baseline.py export` (make gpu-compare)")
    parser.add_argument("--anchor", type=Path, metavar="DIR",
                        help="instead of the check: time our 2D scan against mamba_ssm's 1D scan, built forward-only "
                             "from the sdist sources `dev/gpu/mamba_anchor.py fetch` put in DIR (make gpu-anchor)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    python = sys.executable
    env = probe_environment(python, args.commit)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        if args.compare_baseline is not None and args.anchor is not None:
            print("gpu_check: --compare-baseline and --anchor are separate runs; give one of them.")
            return 2
        if args.anchor is not None:
            if not (args.anchor / ANCHOR_INFO).is_file():
                print(f"gpu_check: {args.anchor} holds no anchor sources; run `make mamba-anchor` where the network "
                      "works and carry that folder here.")
                return 2
            planned = anchor_plan(python, env, Path(tmp), args.jobs, args.anchor.resolve())
        elif args.compare_baseline is not None:
            if not (args.compare_baseline / "csrc").is_dir():
                print(f"gpu_check: {args.compare_baseline} holds no exported kernel; run `make cuda-baseline` "
                      "where git works and carry that folder here.")
                return 2
            planned = compare_plan(python, env, Path(tmp), args.jobs, args.compare_baseline.resolve())
        else:
            baseline = args.baseline.resolve() if (args.baseline / BASELINE_INFO).is_file() else None
            if baseline is not None and not args.nvcc_build:
                print(f"gpu_check: {args.baseline} holds an exported kernel; timing it needs the nvcc build "
                      "(--nvcc-build, or its own run: make gpu-compare), so this check leaves it out.")
            planned = plan(python, env, Path(tmp), args.jobs, baseline, nvcc_build=args.nvcc_build)
        unknown = set(args.skip) - {s.name for s in planned}
        if unknown:
            print(f"gpu_check: --skip names unknown steps {sorted(unknown)}; steps: {[s.name for s in planned]}")
            return 2
        steps = [s for s in planned if s.name not in args.skip]
        if args.dry_run:
            print(f"GPU: {env.gpu} ({env.capability}); torch {env.torch}; triton {env.triton}; budget {args.budget_s:.0f} s")
            for step in steps:
                extra = " ".join(f"{k}={v}" for k, v in step.env.items())
                print(f"{step.name:20s} budget {step.budget_s:4.0f} s (min {step.min_s:3.0f}): {extra} {' '.join(step.command)}")
                if step.companion:
                    print(f"{'':20s} beside it: {' '.join(step.companion)}")
            print(budget_note(steps, args.budget_s))
            return 0
        if env.gpu == "unknown":
            print(f"gpu_check: no GPU visible to {python} (torch {env.torch}); nothing to check, no report written.")
            return 2
        kind = "gpu-anchor" if args.anchor is not None else "gpu-compare" if args.compare_baseline is not None else "gpu-check"
        path = report_path(args.out_dir, env, kind)
        command = "python3 dev/gpu/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])

        def save(finished: bool = False) -> None:
            write_report(path, format_report(env, steps, args.budget_s, started, finished, command.strip()),
                         args.copy_to)

        save()
        run_all(steps, args.budget_s - (time.monotonic() - started), save)
        save(finished=True)
    print(f"\nreport: {path}")
    for step in steps:
        print(f"  {step.name:20s} {step.result} ({step.seconds:.0f} s)")
    return 0 if all(s.result == "pass" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
