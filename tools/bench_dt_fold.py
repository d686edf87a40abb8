#!/usr/bin/env python
"""A/B of the four-route op's folded step-size projection against a batched matmul first, on CPU.

Two variants of the same computation, measured as interleaved calls in one process (call order
alternating every round), in process CPU time (``time.process_time``), so that other jobs on a
shared machine disturb it less than they disturb wall-clock time:

    fold   cross_selective_scan_2d(u, dts, ..., delta_proj_weight=W)   (the CPU kernel projects)
    bmm    cross_selective_scan_2d(u, project_delta(dts, W), ...)       (full-rank delta first)

``ops``: the op alone at the shapes of vmamba2d_tiny's four stages (channels-last u, N = 1),
inference (forward under ``torch.inference_mode``) and training (forward + backward to every
input). ``model``: vmamba2d_tiny (``--model``), 224x224 inference and a training step (forward,
cross-entropy, backward; no optimizer step) with SS2D's fused path switched between the two
variants (``bmm`` is then the fused path as it was before the fold).
``memory``: the training step's peak resident set size, one fresh process per variant.

    python tools/bench_dt_fold.py ops --batch 8 --rounds 7
    python tools/bench_dt_fold.py model --batch 8 --rounds 5
    python tools/bench_dt_fold.py memory --batch 8
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from vmamba2d.models import ss2d  # noqa: E402
from vmamba2d.ops import cross_selective_scan_2d  # noqa: E402
from vmamba2d.ops.delta_proj import project_delta  # noqa: E402

VARIANTS = ("fold", "bmm")
# vmamba2d_tiny's stages at 224x224: (map side, inner width Di, dt rank R).
TINY_STAGES = ((56, 96, 6), (28, 192, 12), (14, 384, 24), (7, 768, 48))


def _op_inputs(batch: int, side: int, dim: int, rank: int, grad: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    routes = 4
    rand = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    inputs = dict(
        u=rand(batch, dim, side, side).contiguous(memory_format=torch.channels_last),
        delta=rand(batch, routes, rank, side, side),
        A=-torch.rand(routes * dim, 1, generator=gen) - 0.3,
        B=rand(batch, routes, 1, side, side),
        C=rand(batch, routes, 1, side, side),
        D=rand(routes * dim),
        delta_bias=rand(routes * dim) * 0.3,
        delta_proj_weight=rand(routes, dim, rank) * rank**-0.5,
    )
    return {k: v.requires_grad_(grad) for k, v in inputs.items()}


def _op_call(variant: str, inputs: dict) -> torch.Tensor:
    if variant == "fold":
        return cross_selective_scan_2d(**inputs, backend="cpu")
    args = dict(inputs)
    weight = args.pop("delta_proj_weight")
    args["delta"] = project_delta(args["delta"], weight)
    return cross_selective_scan_2d(**args, backend="cpu")


def _op_step(variant: str, inputs: dict, train: bool):
    if not train:
        def infer() -> None:
            with torch.inference_mode():
                _op_call(variant, inputs)
        return infer
    leaves = list(inputs.values())

    def train_step() -> None:
        y = _op_call(variant, inputs)
        torch.autograd.grad(y, leaves, torch.ones_like(y))
    return train_step


def _bmm_scan_fused(x, x_proj_weight, dt_projs_weight, dt_projs_bias, A_logs, Ds, route_codes, backend):
    """SS2D's fused path with the step sizes projected by one batched matmul before the op."""
    batch, d_inner, height, width = x.shape
    k, proj_rows, _ = x_proj_weight.shape
    n = A_logs.shape[1]
    r = dt_projs_weight.shape[2]
    x_dbl = torch.bmm(ss2d._batched(x_proj_weight.reshape(k * proj_rows, d_inner), batch),
                      x.reshape(batch, d_inner, height * width)).view(batch, k, proj_rows, height, width)
    dts, Bs, Cs = torch.split(x_dbl, [r, n, n], dim=2)
    A, D, delta_bias = ss2d._scan_parameters(A_logs, Ds, dt_projs_bias)
    return cross_selective_scan_2d(x, project_delta(dts, dt_projs_weight), A, Bs, Cs, D, delta_bias, True,
                                   routes=route_codes, backend=backend)


FOLD_SCAN_FUSED = ss2d.cross_scan_fused


def _use_variant(variant: str) -> None:
    ss2d.cross_scan_fused = FOLD_SCAN_FUSED if variant == "fold" else _bmm_scan_fused


def _model_steps(name: str, batch: int):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name)
    images = torch.randn(batch, 3, 224, 224)
    labels = torch.randint(0, 1000, (batch,))

    def infer() -> None:
        model.eval()
        with torch.inference_mode():
            model(images)

    def train_step() -> None:
        model.train()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        model.zero_grad(set_to_none=True)
        loss.backward()
    return {"inference": infer, "training": train_step}


def _interleaved(steps: dict, rounds: int, warmup: int) -> dict:
    """Process CPU seconds per call of each variant's step, ``rounds`` calls each (after warm-up)."""
    for _ in range(warmup):
        for variant in VARIANTS:
            steps[variant]()
    times = {v: [] for v in VARIANTS}
    for i in range(rounds):
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            start = time.process_time()
            steps[variant]()
            times[variant].append(time.process_time() - start)
    return times


def _summary(label: str, times: dict) -> str:
    fold, bmm = times["fold"], times["bmm"]
    ratios = sorted(b / f for f, b in zip(fold, bmm))
    ms = lambda xs: f"{1e3 * statistics.median(xs):.1f} [{1e3 * min(xs):.1f}-{1e3 * max(xs):.1f}]"  # noqa: E731
    return (f"| {label} | {ms(bmm)} | {ms(fold)} | {statistics.median(ratios):.3f}x "
            f"[{ratios[0]:.3f}-{ratios[-1]:.3f}] |")


def run_ops(args: argparse.Namespace) -> None:
    print("| stage (batch, Di, HxW, R), mode | bmm ms CPU median [min-max] | fold ms CPU median [min-max] "
          "| bmm / fold, median [min-max] of per-round ratios |")
    print("|---|---|---|---|")
    for side, dim, rank in TINY_STAGES:
        for mode in ("inference", "training"):
            train = mode == "training"
            inputs = _op_inputs(args.batch, side, dim, rank, train)
            steps = {v: _op_step(v, inputs, train) for v in VARIANTS}
            times = _interleaved(steps, args.rounds, args.warmup)
            print(_summary(f"{args.batch}, {dim}, {side}x{side}, {rank}, {mode}", times), flush=True)


def run_model(args: argparse.Namespace) -> None:
    model_steps = _model_steps(args.model, args.batch)
    print(f"| {args.model}, batch, mode | bmm ms CPU median [min-max] | fold ms CPU median [min-max] "
          "| bmm / fold, median [min-max] of per-round ratios |")
    print("|---|---|---|---|")
    for mode in args.modes:
        def step_of(variant: str, mode: str = mode):
            def step() -> None:
                _use_variant(variant)
                model_steps[mode]()
            return step
        times = _interleaved({v: step_of(v) for v in VARIANTS}, args.rounds, args.warmup)
        print(_summary(f"{args.batch}, {mode}", times), flush=True)


def run_memory_worker(args: argparse.Namespace) -> None:
    _use_variant(args.variant)
    train_step = _model_steps(args.model, args.batch)["training"]
    train_step()
    print(json.dumps({"variant": args.variant, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_memory(args: argparse.Namespace) -> None:
    print("| variant | training step peak RSS MiB (per fresh process) |")
    print("|---|---|")
    peaks = {v: [] for v in VARIANTS}
    for i in range(args.rounds):
        for variant in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            cmd = [sys.executable, __file__, "memory-worker", "--variant", variant, "--batch", str(args.batch),
                   "--threads", str(args.threads), "--model", args.model]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            peaks[variant].append(json.loads(out.strip().splitlines()[-1])["peak_rss_mib"])
    for variant in VARIANTS:
        print(f"| {variant} | " + ", ".join(f"{p:.0f}" for p in peaks[variant]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("ops", "model", "memory", "memory-worker"))
    parser.add_argument("--model", default="vmamba2d_tiny", help="timm name (model / memory)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=["inference", "training"], choices=("inference", "training"))
    parser.add_argument("--variant", choices=VARIANTS, default="fold")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    {"ops": run_ops, "model": run_model, "memory": run_memory, "memory-worker": run_memory_worker}[args.what](args)


if __name__ == "__main__":
    main()
