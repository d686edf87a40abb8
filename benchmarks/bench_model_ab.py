#!/usr/bin/env python
"""Paired A/B throughput of two models, each held in its own worker process, turns alternating.

``benchmarks/bench_model.py`` measures each (model, batch) in a fresh process, one after the other, so
the slow drift of a shared machine (other jobs, clock changes) lands on one model and not on the
other: the ratios of its rows move by 10-20% between runs. Here both models stay loaded, each in
its own worker process (a model measured in the process of another measures slower), and the
parent alternates turns between them: A then B in even rounds, B then A in odd ones. A turn is
``--rewarm`` unmeasured calls and one measured call: the first call after the other model ran is
slower, by more for the model that allocates more (on CPU the per-route path's first call is ~8%
slower at batch 8, the fused op's ~1%), so the measured call runs in the state a model has when
called repeatedly, as in ``benchmarks/bench_model.py``. Each round gives one ratio time(B) / time(A) of
two calls a few seconds apart, so drift slower than a round cancels; the table reports the median
of the rounds' ratios and their quartiles. The idle worker waits on its pipe: the two never run at
the same time. The worker started second has measured faster (two workers of the same model: 0.92x,
CPU training at batch 8), so by default (``--start-order both``) half of the rounds run in a pair
whose A worker started first and half in a fresh pair whose B worker did, each with its warm-up.

    python benchmarks/bench_model_ab.py              # vmamba2d_tiny, fused vs per-route op, batch 1 8 16
    python benchmarks/bench_model_ab.py vmamba_tiny vmamba_tiny:cross_scan=per_route --phases infer train \\
        --batch-sizes 8 --target 1.3 --train-target 1.2 --out benchmarks/model_cpu_ab.md

Both workers keep freed memory for reuse (``--malloc keep``, as in ``benchmarks/bench_model.py``);
``--malloc-b default`` gives B glibc's own thresholds, so ``A A --malloc-b default`` measures what
the setting is worth to one model.

A model is a ``benchmarks/bench_model.py`` spec (a timm name, optionally ``:key=value,...``). Phases:
``infer`` (one inference call under ``torch.inference_mode``) and ``train`` (forward,
cross-entropy, backward, AdamW step), as in ``benchmarks/bench_model.py``; a fresh pair of workers per
(phase, batch), whose peak memory (CPU: peak RSS of the worker) is reported too.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = "AB "  # prefix of the worker's protocol lines on stdout; other output is not for the parent


def _load_bench_model():
    spec = importlib.util.spec_from_file_location("vmamba2d_bench_model", REPO / "benchmarks" / "bench_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_model = _load_bench_model()


def _say(payload) -> None:
    print(PROTOCOL + json.dumps(payload), flush=True)


def run_worker(args: argparse.Namespace) -> int:
    """Build one model, then serve ``run`` (one timed call: wall and CPU seconds) and ``quit``
    (peak memory in MiB) requests from stdin until ``quit``."""
    bench_model.apply_malloc_setting(args.malloc)
    infer, make_train_step = bench_model.build_steps(args.worker, args.device, args.batch, args.precision,
                                                     args.img_size)
    step = infer if args.phase == "infer" else make_train_step()
    _say("ready")
    for request in sys.stdin:
        if request.strip() == "quit":
            _say(bench_model._peak_memory_mb(args.device))
            return 0
        bench_model._synchronize(args.device)
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        bench_model._synchronize(args.device)
        _say([time.perf_counter() - wall, time.process_time() - cpu])
    return 1  # stdin closed without quit


class Worker:
    """One model in a worker process of this script, driven over its stdin / stdout."""

    def __init__(self, spec: str, phase: str, batch: int, args: argparse.Namespace, malloc: str):
        self.spec = spec
        self._stderr = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", spec, "--phase", phase,
                   "--batch", str(batch), "--device", args.device, "--precision", args.precision,
                   "--img-size", str(args.img_size), "--malloc", malloc]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, text=True, cwd=REPO)
        if self._reply() != "ready":
            raise RuntimeError(f"worker for {spec} did not start")

    def _reply(self):
        for line in self._process.stdout:
            if line.startswith(PROTOCOL):
                return json.loads(line[len(PROTOCOL):])
        self._process.wait()
        self._stderr.seek(0)
        raise RuntimeError(f"worker for {self.spec} exited with code {self._process.returncode}:\n"
                           f"{self._stderr.read()[-3000:]}")

    def _ask(self, request: str):
        self._process.stdin.write(request + "\n")
        self._process.stdin.flush()
        return self._reply()

    def call(self) -> tuple[float, float]:
        """Wall and CPU seconds of one call of the model's step."""
        wall, cpu = self._ask("run")
        return wall, cpu

    def close(self) -> float:
        """Stops the worker; returns its peak memory in MiB."""
        peak = self._ask("quit")
        self._process.wait()
        self._stderr.close()
        return peak

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._stderr.close()


@dataclass
class PairedResult:
    wall_a: float  # median seconds per call of A
    wall_b: float
    ratio: float  # median over rounds of wall(B) / wall(A)
    ratio_quartiles: tuple[float, float]
    cpu_ratio: float  # median over rounds of cpu(B) / cpu(A)
    rounds: int


def summarize(times_a: list[tuple[float, float]], times_b: list[tuple[float, float]]) -> PairedResult:
    """Per-round (wall, cpu) seconds of A and B (round i's calls made back to back) -> medians."""
    if len(times_a) != len(times_b) or not times_a:
        raise ValueError("need one (wall, cpu) pair of A and of B per round, at least one round")
    ratios = [b[0] / a[0] for a, b in zip(times_a, times_b)]
    cpu_ratios = [b[1] / a[1] if a[1] > 0 else float("nan") for a, b in zip(times_a, times_b)]
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return PairedResult(
        wall_a=statistics.median(a[0] for a in times_a),
        wall_b=statistics.median(b[0] for b in times_b),
        ratio=statistics.median(ratios),
        ratio_quartiles=(quartiles[0], quartiles[2]),
        cpu_ratio=statistics.median(cpu_ratios),
        rounds=len(ratios),
    )


def _session(phase: str, batch: int, args: argparse.Namespace, rounds: int,
             b_first: bool) -> tuple[list, list, float, float]:
    """One pair of fresh workers (B's started first when b_first), ``args.warmup`` + ``rounds``
    alternating rounds: the measured (wall, cpu) of A and of B, and each worker's peak MiB."""
    workers: dict[int, Worker] = {}
    try:
        for which in ((1, 0) if b_first else (0, 1)):
            malloc = (args.malloc, args.malloc_b or args.malloc)[which]
            workers[which] = Worker((args.a, args.b)[which], phase, batch, args, malloc)
        times: tuple[list, list] = ([], [])
        for round_index in range(args.warmup + rounds):
            order = (0, 1) if round_index % 2 == 0 else (1, 0)
            for which in order:
                for _ in range(args.rewarm):
                    workers[which].call()
                duration = workers[which].call()
                if round_index >= args.warmup:
                    times[which].append(duration)
        peaks = [workers[which].close() for which in (0, 1)]
    except BaseException:
        for worker in workers.values():
            worker.kill()
        raise
    return times[0], times[1], peaks[0], peaks[1]


# The worker started second has measured faster (two workers of the same model: 0.92x on CPU
# training), so by default half of the rounds run with A's worker started first, half with B's.
START_ORDERS = {"a-first": (False,), "b-first": (True,), "both": (False, True)}


def measure_pair(phase: str, batch: int, args: argparse.Namespace) -> tuple[PairedResult, float, float]:
    """Alternating calls of A and B (warm-up rounds first) in one pair of workers per start order
    (``args.start_order``), the rounds split between them; the pooled result and each model's
    largest peak MiB."""
    b_first_sessions = START_ORDERS[args.start_order]
    times_a: list = []
    times_b: list = []
    peaks_a, peaks_b = [], []
    for index, b_first in enumerate(b_first_sessions):
        rounds = args.rounds // len(b_first_sessions) + (index < args.rounds % len(b_first_sessions))
        if rounds == 0:
            continue
        session_a, session_b, peak_a, peak_b = _session(phase, batch, args, rounds, b_first)
        times_a += session_a
        times_b += session_b
        peaks_a.append(peak_a)
        peaks_b.append(peak_b)
    return summarize(times_a, times_b), max(peaks_a), max(peaks_b)


def _row(phase: str, batch: int, result: PairedResult, peak_a: float, peak_b: float, target) -> str:
    low, high = result.ratio_quartiles
    verdict = "-" if target is None else f">= {target}x: {'met' if result.ratio >= target else 'NOT met'}"
    return (f"| {phase} | {batch} | {1e3 * result.wall_a:.1f} | {1e3 * result.wall_b:.1f} | {result.ratio:.3f}x | "
            f"{low:.3f} - {high:.3f} | {result.cpu_ratio:.3f}x | {peak_a:.0f} | {peak_b:.0f} | {verdict} |")


def _malloc_lines(args: argparse.Namespace) -> list[str]:
    if args.malloc_b is None or args.malloc_b == args.malloc:
        return [f"- CPU malloc: {bench_model.describe_malloc(args.malloc)}"]
    return [f"- CPU malloc of A: {bench_model.describe_malloc(args.malloc)}",
            f"- CPU malloc of B: {bench_model.describe_malloc(args.malloc_b)}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", nargs="?", default="vmamba2d_tiny", help="model A (the one expected faster)")
    parser.add_argument("b", nargs="?", default="vmamba2d_tiny:cross_scan=per_route", help="model B")
    parser.add_argument("--phases", nargs="+", choices=["infer", "train"], default=["infer"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 16])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16", "amp"], default="fp32",
                        help="as in benchmarks/bench_model.py")
    parser.add_argument("--rounds", type=int, default=15, help="measured rounds (one call of each model)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    parser.add_argument("--rewarm", type=int, default=1,
                        help="unmeasured calls of a model right before each measured one")
    parser.add_argument("--start-order", choices=list(START_ORDERS), default="both",
                        help="whose worker starts first: A's, B's, or each for half of the rounds (default)")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--target", type=float, help="say whether the median B / A ratio of inference reaches this")
    parser.add_argument("--train-target", type=float, help="the same for training")
    parser.add_argument("--malloc", choices=bench_model.MALLOC_SETTINGS, default="keep",
                        help="keep: glibc keeps freed memory for reuse in the workers (default); default: its own thresholds")
    parser.add_argument("--malloc-b", choices=bench_model.MALLOC_SETTINGS,
                        help="B's worker's setting, when it differs from --malloc (A/B of the setting itself)")
    parser.add_argument("--out", type=Path, help="also write the markdown table to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["infer", "train"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args)
    if args.rounds < 1 or args.warmup < 0 or args.rewarm < 0 or args.img_size < 32 or args.img_size % 32:
        parser.error("--rounds must be >= 1, --warmup and --rewarm >= 0, --img-size a positive multiple of 32")
    if any(b < 1 for b in args.batch_sizes):
        parser.error("--batch-sizes must be positive")
    for name in ("a", "b"):
        try:
            bench_model.parse_model_spec(getattr(args, name))
        except ValueError as err:
            parser.error(f"model {name.upper()}: {err}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda needs a GPU")

    run = bench_model.describe_run(args.device)  # before the runs: the load average at start
    rows = []
    for phase in args.phases:
        for batch in args.batch_sizes:
            result, peak_a, peak_b = measure_pair(phase, batch, args)
            target = args.target if phase == "infer" else args.train_target
            rows.append(_row(phase, batch, result, peak_a, peak_b, target))
            print(rows[-1], file=sys.stderr, flush=True)
    load = os.getloadavg()
    lines = [f"# Paired A/B model throughput ({args.device})", "", *run,
             f"- load average at end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
             f"- A: `{args.a}`; B: `{args.b}`; {args.precision}, input {args.img_size}x{args.img_size}",
             "- settings: one worker process per model (a fresh pair per phase, batch and start order; start "
             f"order {args.start_order}), calls alternating "
             f"A B / B A, {args.warmup} warm-up + {args.rounds} measured rounds, {args.rewarm} unmeasured call(s) of "
             "a model right before each measured one; per round the ratio "
             "time(B) / time(A) of its two calls; median and quartiles over rounds; CPU time: the worker's "
             "process time",
             "- peak memory: " + ("torch.cuda.max_memory_allocated" if args.device == "cuda"
                                  else "peak RSS of the worker process"),
             *_malloc_lines(args),
             "",
             "| phase | batch | A ms (median) | B ms (median) | B / A (median) | B / A quartiles | B / A CPU time | "
             "A peak MiB | B peak MiB | target (median B / A) |",
             "|---|---|---|---|---|---|---|---|---|---|",
             *rows]
    text = "\n".join(lines) + "\n"
    bench_model.emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
