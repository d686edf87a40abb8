"""dev/gpu/gpu_check.py orchestration on the CPU: step runner (pass, fail, time-outs, budget skips),
report writer and plan, with stand-in steps; no GPU result is produced or faked in a report
outside the test's temporary folder."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from support.script_loading import load_gpu_tool, load_script

TOOL = Path(__file__).resolve().parents[1] / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("dev/gpu/gpu_check.py", "gpu_check")


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a killed process that nobody reaped yet is a zombie: not running)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_steps_pass_fail_time_out_and_are_skipped_when_the_budget_is_spent(gpu_check):
    Step = gpu_check.Step
    steps = [
        Step("ok", _python("print('all good')"), budget_s=20, min_s=0),
        Step("fails", _python("import sys; print('boom'); sys.exit(3)"), budget_s=20, min_s=0),
        Step("nothing", _python("import sys; sys.exit(2)"), budget_s=20, min_s=0, meanings={2: "not run (no GPU)"}),
        # a child that would outlive its parent: the whole process group must be stopped
        Step("hangs", _python("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
                              "'import time; time.sleep(60)']); print('child', child.pid, flush=True); time.sleep(60)"),
             budget_s=2, min_s=0),
        Step("too-big", _python("print('never')"), budget_s=50, min_s=1000),
        Step("told", _python("import sys; print(sys.argv[1:])"), budget_s=60, min_s=0, time_option="--max-seconds"),
    ]
    done = []
    start = time.monotonic()
    gpu_check.run_all(steps, budget_s=120, on_step_done=lambda: done.append(1))
    assert time.monotonic() - start < 30
    results = {s.name: s.result for s in steps}
    assert results["ok"] == "pass" and "all good" in steps[0].output
    assert results["fails"] == "FAIL (exit 3)" and "boom" in steps[1].output
    assert results["nothing"] == "not run (no GPU)"
    assert results["hangs"].startswith("timed out") and steps[3].seconds < 15
    child = int(steps[3].output.split("child")[1].split()[0])
    time.sleep(0.5)
    assert not _running(child), "the step's child process outlived the step"
    assert results["too-big"].startswith("skipped (time:")
    assert results["told"] == "pass" and "'--max-seconds', '30'" in steps[5].output  # 60 s budget - 30 s margin
    assert len(done) == len(steps)


def test_a_companion_runs_beside_its_step_within_the_budget(gpu_check):
    Step = gpu_check.Step
    steps = [
        Step("both", _python("import time; time.sleep(1); print('main done')"), budget_s=20, min_s=0,
             companion=_python("print('companion done')")),
        Step("companion-fails", _python("print('main')"), budget_s=20, min_s=0,
             companion=_python("import sys; sys.exit(4)")),
        Step("companion-hangs", _python("print('main')"), budget_s=2, min_s=0,
             companion=_python("import time; time.sleep(60)")),
    ]
    start = time.monotonic()
    gpu_check.run_all(steps, budget_s=60, on_step_done=lambda: None)
    assert time.monotonic() - start < 20
    assert [s.result for s in steps] == ["pass", "pass", "pass"]  # the companion does not decide the step
    assert [s.companion_result for s in steps] == ["pass", "FAIL (exit 4)", "timed out"]
    assert "main done" in steps[0].output and "[companion] companion done" in steps[0].output
    report = gpu_check.format_report(gpu_check.Environment(), steps, 60, start, True, "cmd")
    assert "| companion-fails | pass (beside it, -c import sys; sys.exit(4): FAIL (exit 4)) |" in report


def test_report_holds_environment_steps_and_tables(gpu_check, tmp_path):
    env = gpu_check.Environment(gpu="Test GPU 80GB", capability="9.0", driver="1.2", memory="80 GiB",
                                python="3.12.3", torch="2.11.0", cuda="13.0", triton="3.6.0",
                                commit="abc1234", date="2026-11-22 20:30 UTC")
    table = tmp_path / "bench.md"
    table.write_text("# Bench title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    steps = [
        gpu_check.Step("bench", ["python", "bench.py"], budget_s=10, min_s=1, table=table, result="pass",
                       seconds=3, output="line 1\n========= ERROR SUMMARY: 0 errors\n"),
        gpu_check.Step("later", ["true"], budget_s=10, min_s=1, env={"TOOLS": "memcheck"}),
    ]
    text = gpu_check.format_report(env, steps, budget_s=560, started=time.monotonic(), finished=False,
                                   command="python3 dev/gpu/gpu_check.py")
    assert "Test GPU 80GB (compute capability 9.0, 80 GiB), driver 1.2" in text
    assert "torch 2.11.0 (CUDA 13.0), triton 3.6.0" in text and "commit: abc1234" in text
    assert "| bench | pass | 3 | 10 |" in text and "| later | not run | 0 | 10 |" in text
    assert "### Bench title" in text and "| 1 | 2 |" in text
    assert "    ========= ERROR SUMMARY: 0 errors" in text and "with TOOLS=memcheck" in text
    assert "cut off" in text
    path = gpu_check.report_path(tmp_path, env)
    assert path.name == "gpu-check-20261122-2030-test-gpu-80gb-abc1234.md"
    gpu_check.write_report(path, text, copy_to=tmp_path / "copy")
    assert path.read_text() == (tmp_path / "copy" / path.name).read_text() == text


def test_plan_measures_the_nvrtc_path_and_runs_every_sanitizer_tool(gpu_check, tmp_path):
    env = gpu_check.Environment(capability="8.6")
    steps = gpu_check.plan("python3", env, tmp_path, jobs=16)
    names = [s.name for s in steps]
    # First-run order: the NVRTC kernels compiled ahead, the v4 forward's timing, correctness, the Triton
    # primitive, measurements, sanitizers last; no nvcc build (nothing after it would use it).
    assert names == ["precompile", "bench-v4", "tests", "triton-reverse-scan", "bench-scan",
                     "bench-cross-scan", "bench-model-fp32", "bench-model-bf16", "sanitize-memcheck",
                     "sanitize-racecheck", "sanitize-synccheck", "sanitize-initcheck"]
    assert not any(s.env.get("VMAMBA2D_NVCC_BUILD") for s in steps)
    step = dict(zip(names, steps))
    precompile, tests = step["precompile"], step["tests"]
    assert precompile.command[1:] == ["-m", "vmamba2d.ops.precompile", "--arch", "86", "--jobs", "16"]
    # beside it, the C++ parts later steps would otherwise JIT-compile inside their budgets
    assert precompile.companion[1] == "dev/gpu/jit_prebuild.py"
    assert Path(gpu_check.REPO, precompile.companion[1]).is_file()
    assert all(step[n].env == {"VMAMBA2D_CUDA_KERNELS": "nvrtc"} for n in ("bench-model-fp32", "bench-model-bf16"))
    assert "tests/ops/compiled/test_scan_cuda.py" in tests.command and "-m" in tests.command
    assert "-v" in tests.command and "-q" not in tests.command  # one line per test, even when stopped
    assert all(Path(gpu_check.REPO, f).is_file() for f in tests.command if f.startswith("tests/"))
    assert all(Path(gpu_check.REPO, step[n].command[1]).is_file() for n in ("bench-v4", "triton-reverse-scan"))
    models = next(s for s in steps if s.name == "bench-model-bf16")
    assert "vmamba2d_tiny" in models.command and "convnext_tiny" in models.command
    uncached = {s.name for s in steps if s.env.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"}
    assert uncached == {"sanitize-memcheck", "sanitize-initcheck"}
    assert step["sanitize-racecheck"].env["BACKENDS"] == "cuda"  # Triton's hazards are upstream's
    # bench-v4, the most wanted table, has the largest budget and is told a limit just inside it
    v4 = step["bench-v4"]
    assert v4.budget_s == max(s.budget_s for s in steps)
    assert 0 < v4.budget_s - float(v4.command[v4.command.index("--max-seconds") + 1]) <= 10


def test_nvcc_build_is_an_option_that_comes_first(gpu_check, tmp_path):
    steps = gpu_check.plan("python3", gpu_check.Environment(capability="8.6"), tmp_path, jobs=16, nvcc_build=True)
    build = steps[0]
    assert build.name == "build" and build.command[1:] == ["setup.py", "build_ext", "--inplace"]
    assert build.env == {"TORCH_CUDA_ARCH_LIST": "8.6", "MAX_JOBS": "16", "VMAMBA2D_NVCC_BUILD": "1"}
    assert build.companion is None and steps[1].name == "precompile"
    default = [s.name for s in gpu_check.plan("python3", gpu_check.Environment(capability="8.6"), tmp_path, jobs=16)]
    assert [s.name for s in steps[1:]] == default


def test_the_tests_step_runs_the_files_with_cuda_marked_tests_dispatch_first(gpu_check):
    files = gpu_check.cuda_test_files()
    assert files[:2] == list(gpu_check.GPU_TESTS_FIRST)
    marked = {p.relative_to(gpu_check.REPO).as_posix() for p in (gpu_check.REPO / "tests").rglob("test_*.py")
              if "pytest.mark.cuda" in p.read_text()}
    assert set(files) == marked and len(files) == len(marked)  # each once; none that -m cuda would run nothing of
    assert files[-1].startswith("tests/ops/triton/")  # Triton compiles at first use: last


STAND_IN_TESTS = '''import time
import pytest

pytestmark = pytest.mark.cuda


@pytest.fixture
def broken():
    raise RuntimeError("fixture")


def test_passes():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_fails(n):
    assert n == 1


def test_errors(broken):
    pass


def test_asserts():
    assert False


def test_hangs():
    time.sleep(120)
'''


def test_a_failed_test_is_named_even_when_the_step_is_stopped(gpu_check, tmp_path):
    """The tests step's own pytest options on a stand-in file: two failures and an erroring fixture, then
    a test that outlives the budget. The report names each failure and the test that was running."""
    tests = tmp_path / "test_stand_in.py"
    tests.write_text(STAND_IN_TESTS)
    planned = next(s for s in gpu_check.plan(sys.executable, gpu_check.Environment(capability="9.0"), tmp_path, 2)
                   if s.name == "tests")
    options = [a for a in planned.command[1:] if not a.startswith("tests/")]
    step = gpu_check.Step("tests", [sys.executable, *options, str(tests)], budget_s=12, min_s=0,
                          meanings=planned.meanings)
    gpu_check.run_all([step], budget_s=60, on_step_done=lambda: None)
    assert step.result.startswith("timed out"), step.output
    named = [test.split("test_stand_in.py")[1] for test in gpu_check.failed_tests(step.output)]
    assert named == ["::test_fails[2]", "::test_errors", "::test_asserts"]
    assert gpu_check.unfinished_test(step.output).endswith("test_stand_in.py::test_hangs")
    report = gpu_check.format_report(gpu_check.Environment(), [step], 60, time.monotonic(), True, "cmd")
    assert "Failed tests (3):" in report and "::test_fails[2]" in report and "::test_asserts" in report
    assert "Stopped while running: `" in report and "::test_hangs`" in report


def test_failures_are_read_from_the_summary_and_collection_errors_too(gpu_check):
    output = "\n".join([
        "tests/a.py::test_one PASSED                                  [ 33%]",
        "tests/a.py::test_two[x y] FAILED                             [ 66%]",
        "_________________ ERROR collecting tests/b.py _________________",
        "=========================== short test summary info ============================",
        "FAILED tests/a.py::test_two[x y] - AssertionError: assert 2 == 1",
        "FAILED tests/c.py::test_three - RuntimeError: boom",
        "ERROR tests/b.py - ModuleNotFoundError: No module named 'mamba_ssm'",
        "========================= 2 failed, 1 passed, 1 error in 3.10s =========================",
    ])
    assert gpu_check.failed_tests(output) == ["tests/a.py::test_two[x y]", "tests/b.py", "tests/c.py::test_three"]
    assert gpu_check.unfinished_test(output) is None  # it ran to its summary
    started = "tests/a.py::test_one PASSED [ 50%]\ntests/a.py::test_two[x y] "
    assert gpu_check.unfinished_test(started) == "tests/a.py::test_two[x y]"
    sanitizer = "=========     at void vmamba2d::scan2d::load_cells<float>(...)+0x10 in scan2d_tile.cuh:218"
    assert gpu_check.failed_tests(sanitizer) == [] and gpu_check.unfinished_test(sanitizer) is None


def test_with_an_exported_baseline_it_builds_beside_and_times_both(gpu_check, tmp_path):
    steps = gpu_check.plan("python3", gpu_check.Environment(capability="9.0"), tmp_path, jobs=16,
                           baseline=tmp_path / "base", nvcc_build=True)
    names = [s.name for s in steps]
    assert names.index("bench-model-bf16") < names.index("bench-versions") < names.index("sanitize-memcheck")
    assert steps[0].companion[1:5] == ["dev/gpu/cuda_baseline.py", "build", "--dir", str(tmp_path / "base")]
    versions = steps[names.index("bench-versions")]
    assert versions.command[1] == "dev/gpu/bench_cuda_versions.py" and versions.time_option == "--max-seconds"
    assert "--baseline" in versions.command and str(tmp_path / "base") in versions.command
    # without the nvcc build there is nothing to time the earlier kernel against
    plain = gpu_check.plan("python3", gpu_check.Environment(capability="9.0"), tmp_path, jobs=16,
                           baseline=tmp_path / "base")
    assert not {"build", "bench-versions"} & {s.name for s in plain}


def test_the_default_baseline_is_used_only_when_it_holds_an_export(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "probe_environment", lambda python, commit: gpu_check.Environment())
    assert gpu_check.main(["--dry-run", "--nvcc-build", "--baseline", str(tmp_path)]) == 0
    assert "bench-versions" not in capsys.readouterr().out
    (tmp_path / gpu_check.BASELINE_INFO).write_text("{}")
    assert gpu_check.main(["--dry-run", "--nvcc-build", "--baseline", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bench-versions" in out and "beside it:" in out and "more than the run's" in out
    assert gpu_check.main(["--dry-run", "--baseline", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bench-versions" not in out and "--nvcc-build" in out  # says why it is left out


@pytest.mark.parametrize("baseline", [None, "base"])
def test_step_budgets_fit_the_default_run(gpu_check, tmp_path, baseline):
    steps = gpu_check.plan("python3", gpu_check.Environment(capability="9.0"), tmp_path, jobs=16,
                           baseline=tmp_path / baseline if baseline else None)
    default_budget = gpu_check.parse_args([]).budget_s
    assert sum(s.budget_s for s in steps) <= default_budget - gpu_check.REPORT_RESERVE_S < 600
    assert sum(gpu_check.BUDGETS_S.values()) <= default_budget - gpu_check.REPORT_RESERVE_S
    assert all(s.min_s <= s.budget_s for s in steps)
    assert "more than" not in gpu_check.budget_note(steps, default_budget)


def test_bench_scan_is_told_a_limit_that_leaves_it_time_to_write_its_table(gpu_check, tmp_path):
    bench = next(s for s in gpu_check.plan("python3", gpu_check.Environment(capability="9.0"), tmp_path, jobs=16)
                 if s.name == "bench-scan")
    assert bench.time_option == "--max-seconds"
    assert 10 <= bench.time_margin_s < bench.budget_s - bench.time_margin_s  # more time measuring than kept back


def test_triton_smoke_test_without_a_gpu_says_so():
    result = subprocess.run([sys.executable, str(TOOL.parent / "triton_reverse_scan_smoke.py")],
                            capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert result.returncode == 2 and "no GPU" in result.stdout


def test_full_run_with_stand_in_steps_writes_one_report(gpu_check, monkeypatch, tmp_path):
    env = gpu_check.Environment(gpu="Stand-in GPU", capability="9.0", commit="f00", date="2026-01-02 03:04 UTC")
    monkeypatch.setattr(gpu_check, "probe_environment", lambda python, commit: env)
    monkeypatch.setattr(gpu_check, "plan", lambda python, env, work, jobs, baseline, **options: [
        gpu_check.Step("first", _python("print('one')"), budget_s=20, min_s=0),
        gpu_check.Step("second", _python("import sys; sys.exit(1)"), budget_s=20, min_s=0),
    ])
    status = gpu_check.main(["--out-dir", str(tmp_path), "--budget-s", "100"])
    reports = list(tmp_path.glob("gpu-check-*.md"))
    assert status == 1 and [r.name for r in reports] == ["gpu-check-20260102-0304-stand-in-gpu-f00.md"]
    text = reports[0].read_text()
    assert "| first | pass |" in text and "| second | FAIL (exit 1) |" in text and "cut off" not in text


def test_without_a_gpu_it_writes_no_report(gpu_check, monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "probe_environment", lambda python, commit: gpu_check.Environment())
    assert gpu_check.main(["--out-dir", str(tmp_path)]) == 2
    assert list(tmp_path.iterdir()) == []


def test_gpu_names_become_file_name_slugs(gpu_check):
    assert gpu_check.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert gpu_check.gpu_slug("NVIDIA H200") == "h200"


SANITIZE = TOOL.with_name("cuda_sanitize.sh")


CURRENT_HELP = ("  --kernel-name <filter>", "  --report-api-errors arg (=explicit)")


def _fake_sanitizer(tmp_path: Path, body: str, help_lines: tuple[str, ...] = CURRENT_HELP) -> Path:
    """A stand-in compute-sanitizer: answers --help with ``help_lines`` (by default a current release's
    --kernel-name and --report-api-errors options), else says its arguments and the cases the script
    chose (SANITIZE_CASES) and runs ``body``."""
    fake = tmp_path / "compute-sanitizer"
    answer = "; ".join(f"echo '{line}'" for line in help_lines) or "true"
    fake.write_text("#!/bin/bash\n"
                    f'if [ "$1" = "--help" ]; then {answer}; exit 0; fi\n'
                    f'echo "sanitizer args: $* cases: [$SANITIZE_CASES]"\n{body}\n')
    fake.chmod(0o755)
    return fake


def _sanitize(fake: Path, tools: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SANITIZER=str(fake), TOOLS=tools, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SANITIZE)], capture_output=True, text=True, env=env, timeout=120)


def test_sanitize_script_reports_tool_errors_per_tool(tmp_path):
    run = _sanitize(_fake_sanitizer(tmp_path, "exit 3"), "memcheck racecheck")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "!! memcheck reported errors" in run.stdout and "!! racecheck reported errors" in run.stdout
    assert "--kernel-name kns=scan2d" in run.stdout


def _tool_args(output: str) -> dict[str, str]:
    """tool -> the argument line the stand-in sanitizer printed for it."""
    lines = [line for line in output.splitlines() if line.startswith("sanitizer args:")]
    return {line.split("--tool ")[1].split()[0]: line for line in lines}


def test_memcheck_leaves_out_api_errors_and_initcheck_sees_every_kernel_on_fewer_cases(tmp_path):
    run = _sanitize(_fake_sanitizer(tmp_path, "exit 0"), "memcheck racecheck synccheck initcheck")
    assert run.returncode == 0, run.stdout + run.stderr
    args = _tool_args(run.stdout)
    # memcheck: failing API calls of cuda.bindings' symbol probing are not memory errors
    assert "--report-api-errors no" in args["memcheck"]
    assert all("--report-api-errors" not in args[t] for t in ("racecheck", "synccheck", "initcheck"))
    # the scan kernels only, except initcheck, which must see torch's writes to know a byte is written
    assert all("--kernel-name kns=scan2d" in args[t] for t in ("memcheck", "racecheck", "synccheck"))
    assert "--kernel-name" not in args["initcheck"]
    assert all("cases: []" in args[t] for t in ("memcheck", "racecheck", "synccheck"))  # every case
    chosen = args["initcheck"].split("cases: [")[1].rstrip("]").split()
    assert 0 < len(chosen) < 6 and all(0 <= int(i) < 6 for i in chosen)  # some of the script's 6 cases


def test_an_older_sanitizer_without_the_options_still_runs_every_tool(tmp_path):
    run = _sanitize(_fake_sanitizer(tmp_path, "exit 0", help_lines=()), "memcheck initcheck")
    assert run.returncode == 0, run.stdout + run.stderr
    args = _tool_args(run.stdout)
    assert "--report-api-errors" not in args["memcheck"] and "--kernel-name" not in args["memcheck"]
    assert "no kernel filter option" in run.stdout


def test_a_memory_error_still_fails_memcheck(tmp_path):
    run = _sanitize(_fake_sanitizer(tmp_path, "echo '========= Invalid __global__ read of size 4 bytes'; exit 3"),
                    "memcheck")
    assert run.returncode == 1 and "!! memcheck reported errors" in run.stdout


TRITON_REDUCE_RACE = ("echo '========= Error: Race reported between Write access at scan2d_bwd_kernel+0x3220 in "
                      "standard.py:293'; echo '=========     and Write access at scan2d_bwd_kernel+0x3220 in "
                      "standard.py:293 [228 hazards]'; exit 3")
# a hazard at a line of vmamba2d/ops/triton/kernels.py (racecheck names files by their base name)
OUR_RACE = ("echo '========= Error: Race reported between Write access at scan2d_bwd_kernel+0x10 in "
            "kernels.py:480'; echo '=========     and Read access at scan2d_bwd_kernel+0x20 in "
            "standard.py:293 [3 hazards]'; exit 3")


def test_racecheck_hazards_only_in_tritons_library_get_their_own_status(tmp_path):
    run = _sanitize(_fake_sanitizer(tmp_path, TRITON_REDUCE_RACE), "racecheck")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "hazards only in Triton's own code" in run.stdout and "standard.py" in run.stdout


@pytest.mark.parametrize("body, tools", [(OUR_RACE, "racecheck"), (TRITON_REDUCE_RACE, "memcheck")])
def test_hazards_at_our_lines_or_errors_of_other_tools_fail(tmp_path, body, tools):
    run = _sanitize(_fake_sanitizer(tmp_path, body), tools)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"!! {tools} reported errors" in run.stdout


def test_a_real_error_outranks_upstream_hazards(tmp_path):
    body = 'if [[ "$*" == *racecheck* ]]; then ' + TRITON_REDUCE_RACE + "; else exit 3; fi"
    run = _sanitize(_fake_sanitizer(tmp_path, body), "racecheck memcheck")
    assert run.returncode == 1, run.stdout + run.stderr


@pytest.mark.slow  # imports torch and vmamba2d in a child process: a few seconds, more on a busy machine
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_sanitize_script_without_a_gpu_checks_nothing_and_says_so(tmp_path):
    # the stand-in runs the case script itself (its last two arguments: python, script)
    run = _sanitize(_fake_sanitizer(tmp_path, '"${@: -2:1}" "${@: -1}"'), "memcheck")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "nothing was checked" in run.stdout


def test_unknown_step_names_are_refused(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "probe_environment", lambda python, commit: gpu_check.Environment())
    assert gpu_check.main(["--skip", "bench-scan", "no-such-step", "--dry-run"]) == 2
    assert "no-such-step" in capsys.readouterr().out
    assert gpu_check.main(["--skip", "bench-scan", "--dry-run"]) == 0
    assert "bench-scan" not in capsys.readouterr().out.split("budget", 1)[1]


def test_bench_v4_times_the_four_route_rows_first():
    bench_v4 = load_script("dev/gpu/bench_v4.py", "bench_v4")
    assert bench_v4.CASES[:4] == (("cross", 192, 56), ("cross", 768, 14), ("cross", 384, 28), ("cross", 1536, 7))
    assert bench_v4.CASES[4] == ("fold", 192, 56)
    assert {op for op, _, _ in bench_v4.CASES[5:]} == {"single"}
    # every stage of the model in each op, each once
    stages = set(bench_v4.SHAPES)
    assert {(dim, side) for op, dim, side in bench_v4.CASES if op == "cross"} == stages
    assert {(dim, side) for op, dim, side in bench_v4.CASES if op == "single"} == stages
    assert len(set(bench_v4.CASES)) == len(bench_v4.CASES)
    # the pinned alternatives are timed at sides the four-route rows have
    assert set(bench_v4.PAIR_SIDES) | set(bench_v4.DEEP_PAIR_SIDES) <= {side for _, side in stages}


def test_bench_v4_copy_row_is_in_gb_per_second():
    bench_v4 = load_script("dev/gpu/bench_v4.py", "bench_v4")
    # the 2026-11-29 H200 copy: 1 GiB read + 1 GiB written in 0.512 ms = 2^31 B / 0.512e-3 s = 4194 GB/s
    bytes_per_ms = 2 * 2 ** 30 / 0.512
    label = bench_v4.copy_label(bytes_per_ms)
    assert label.startswith("4194 GB/s") and "0.512 ms" in label
    # a call moving half the copy's bytes in the copy's time runs at 50% of it; the same bytes in twice the time too
    assert bench_v4.percent_of_copy(2 ** 30, 0.512, bytes_per_ms) == pytest.approx(50)
    assert bench_v4.percent_of_copy(2 ** 31, 1.024, bytes_per_ms) == pytest.approx(50)


def test_a_stopped_prebuild_still_runs_its_cleanup(gpu_check, tmp_path):
    """A build stopped at the step's budget (SIGTERM to its process group) must leave no lock behind:
    the stand-in holds a lock file the way torch's older JIT build did (removed in a `finally`) while it
    waits on a child, like ninja."""
    jit_prebuild = load_script("dev/gpu/jit_prebuild.py", "jit_prebuild")
    lock = tmp_path / "lock"
    build = (f"import pathlib, subprocess\nlock = pathlib.Path({str(lock)!r})\nlock.touch()\n"
             "try:\n    subprocess.run(['sleep', '60'])\nfinally:\n    lock.unlink()\n")
    step = gpu_check.Step("stopped", _python(jit_prebuild.ON_TERM + build), budget_s=3, min_s=0)
    gpu_check.run_all([step], budget_s=60, on_step_done=lambda: None)
    assert step.result.startswith("timed out") and not lock.exists()


@pytest.mark.slow  # two child processes import torch and vmamba2d
def test_jit_prebuild_makes_both_cpp_parts_available(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(TOOL.parents[2]))
    run = subprocess.run([sys.executable, str(TOOL.with_name("jit_prebuild.py"))], capture_output=True, text=True,
                         env=env, timeout=1200)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "NVRTC host driver: available" in run.stdout and "CPU kernel: available" in run.stdout


def test_bench_v4_table_and_no_gpu_exit(tmp_path):
    bench_v4 = load_script("dev/gpu/bench_v4.py", "bench_v4")
    rows = [{"shape": "128x192x56x56", "dtype": "float32", "rs ms": "0.5"}, {"shape": "copy", "plan": "4000 GB/s"}]
    assert bench_v4.format_table(rows).splitlines() == [
        "| shape | dtype | rs ms | plan |", "|---|---|---|---|", "| 128x192x56x56 | float32 | 0.5 |  |",
        "| copy |  |  | 4000 GB/s |"]
    # vmamba2d_tiny's stages: channels double while the map's side halves
    assert [dim * side * side for dim, side in bench_v4.SHAPES] == [192 * 56 * 56 // 2 ** i for i in range(4)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(TOOL.with_name("bench_v4.py")), "--out", str(tmp_path / "t.md")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "needs a GPU" in run.stdout


def test_anchor_plan_builds_the_anchor_beside_our_kernel_then_times_both_within_the_run(gpu_check, tmp_path):
    steps = gpu_check.anchor_plan("python3", gpu_check.Environment(capability="9.0"), tmp_path, 16, tmp_path / "anchor")
    assert [s.name for s in steps] == ["build", "bench-anchor"]
    build, bench = steps
    assert build.command[1:] == ["setup.py", "build_ext", "--inplace"]
    assert build.env == {"TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "16", "VMAMBA2D_NVCC_BUILD": "1"}
    assert build.companion[1:] == ["dev/gpu/mamba_anchor.py", "build", "--dir", str(tmp_path / "anchor"), "--jobs", "4"]
    assert bench.command[1:4] == ["dev/gpu/bench_anchor.py", "--anchor", str(tmp_path / "anchor")]
    assert bench.table == tmp_path / "bench_anchor.md" and bench.command[-1] == str(bench.table)
    assert bench.time_option == "--max-seconds" and "not built" in bench.meanings[2]
    assert all(Path(gpu_check.REPO, s.command[1]).is_file() for s in steps) and Path(gpu_check.REPO, build.companion[1]).is_file()
    default_budget = gpu_check.parse_args([]).budget_s
    assert sum(s.budget_s for s in steps) <= default_budget - gpu_check.REPORT_RESERVE_S < 600
    assert all(s.min_s <= s.budget_s for s in steps)
    # the default check is unchanged: no anchor step in it, nor a build
    names = [s.name for s in gpu_check.plan("python3", gpu_check.Environment(capability="9.0"), tmp_path, jobs=16)]
    assert "bench-anchor" not in names and "build" not in names


def test_anchor_run_needs_fetched_sources_and_is_a_run_of_its_own(gpu_check, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "probe_environment", lambda python, commit: gpu_check.Environment())
    assert gpu_check.main(["--anchor", str(tmp_path / "missing"), "--out-dir", str(tmp_path)]) == 2
    assert "make mamba-anchor" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    (tmp_path / gpu_check.ANCHOR_INFO).write_text("{}")
    assert gpu_check.main(["--anchor", str(tmp_path), "--compare-baseline", str(tmp_path), "--dry-run"]) == 2
    assert "separate runs" in capsys.readouterr().out
    assert gpu_check.main(["--anchor", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bench-anchor" in out and "beside it:" in out and "mamba_anchor.py build" in out
    assert "sanitize" not in out


def test_the_anchor_info_file_is_the_one_a_fetch_writes(gpu_check):
    anchor = load_gpu_tool("mamba_anchor")  # it imports its dev/gpu neighbours
    assert gpu_check.ANCHOR_INFO == anchor.INFO_FILE
