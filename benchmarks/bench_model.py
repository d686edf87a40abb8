#!/usr/bin/env python
"""Throughput and peak memory of 2DVMamba-T against VMamba-T, ConvNeXt-T and Swin-T.

For each model and batch size a fresh worker process builds the model, times inference
(``torch.inference_mode``) and then full training steps (forward, cross-entropy, backward, AdamW
step), and reports images per second and peak memory (CPU: the worker's peak resident set size;
GPU: ``torch.cuda.max_memory_allocated``). Prints a markdown table; ``--out FILE`` also writes it.

    python benchmarks/bench_model.py                          # CPU, batch 1 and 16
    python benchmarks/bench_model.py --device cuda            # GPU, batch 128, fp32 and bf16 autocast
    python benchmarks/bench_model.py --device cuda --models vmamba2d_tiny vmamba_tiny convnext_tiny
    python benchmarks/bench_model.py --batch-sizes 1 --iters 5 --out benchmarks/model_cpu.md
    python benchmarks/bench_model.py --models vmamba2d_tiny vmamba2d_tiny:cross_scan=per_route --profile
    python benchmarks/bench_model.py --device cuda --precisions fp32 bf16 amp --compile both

A model is a timm name, optionally with ``:key=value,...`` model arguments (e.g.
``vmamba2d_tiny:cross_scan=per_route`` for the per-route SS2D path). ``--profile`` adds, per
model, torch.profiler's operators by self time of one inference call and the share of the
route-copy operators (copy_, flip, cat, stack); on CUDA instead the GPU time of one inference call
and one training step by kernel kind, with the share of the step the GPU was busy
(benchmarks/gpu_time.py). ``--compile on`` runs the model under
``torch.compile`` (default options; the compile happens in the warm-up calls, which are not
timed), ``--compile both`` eager and compiled rows (``MODEL [torch.compile]``).

With ``--account`` (GPU runs) each row also gets the byte account's roofline estimate of its inference
(``vmamba2d.analysis.traffic``, traced on fake tensors in this process: fp32, or autocast in the
row's type): with the scan op counted as a fused kernel must move it, and as its CUDA path runs it
today (``--scan-traffic cuda`` of benchmarks/model_traffic.py). It is an estimate beside the
measurement, never a measurement.

Targets checked at the end: CPU inference of vmamba2d_tiny within 1.5x of vmamba_tiny and 3x of
convnext_tiny; GPU: vmamba2d_tiny >= 0.9x vmamba_tiny and above VMamba-T's published 1686 img/s
(A100, fp32, batch 128). Where a ``MODEL:cross_scan=per_route`` row is measured too: the fused
four-route op >= 1.3x its inference and >= 1.2x its training throughput, with lower peak memory;
on CPU also vmamba2d_tiny >= 1.0x convnext_tiny at batch 8 and above.

Each worker first makes glibc keep freed memory for reuse (``--malloc keep``, the default:
:func:`vmamba2d.cpu_malloc.keep_freed_memory`, as the classification scripts do on CPU); ``--malloc
default`` measures with glibc's own thresholds, where every large tensor is a fresh mapping.

Rows of separate processes, minutes apart, carry a shared machine's drift into their ratios;
``benchmarks/bench_model_ab.py`` measures two models in alternating turns instead.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_MODELS = ["vmamba2d_tiny", "vmamba_tiny", "convnext_tiny", "swin_tiny_patch4_window7_224"]
PUBLISHED_VMAMBA_T_IMG_S = 1686  # VMamba-T, A100, fp32, batch 128 (VMamba paper)
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a source checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_time.py beside this file, also when loaded by path


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _peak_memory_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _timed(step, iters: int, warmup: int, device: str) -> float:
    """Fastest seconds per call of ``step`` over ``iters`` calls after ``warmup`` untimed calls.

    The minimum (as timeit recommends) is the estimate least disturbed by other processes on a
    shared machine.
    """
    for _ in range(warmup):
        step()
    durations = []
    for _ in range(iters):
        _synchronize(device)
        start = time.perf_counter()
        step()
        _synchronize(device)
        durations.append(time.perf_counter() - start)
    return min(durations)


COPY_OPERATORS = ("aten::copy_", "aten::flip", "aten::cat", "aten::stack")


def parse_model_spec(spec: str) -> tuple[str, dict]:
    """``"name:key=value,..."`` -> (timm name, model kwargs); values stay strings except ints."""
    name, _, options = spec.partition(":")
    kwargs = {}
    for item in filter(None, options.split(",")):
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise ValueError(f"model options must be key=value, got {item!r} in {spec!r}")
        kwargs[key] = int(value) if value.lstrip("-").isdigit() else value
    return name, kwargs


def _profile_inference(infer) -> dict:
    """torch.profiler over one inference call: the top operators by self CPU time and the share
    of the route-copy operators."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        infer()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [(e.key, e.self_cpu_time_total / total) for e in ranked[:12]]
    copies = sum(e.self_cpu_time_total for e in events if e.key in COPY_OPERATORS) / total
    return dict(top=top, copy_share=copies)


COMPILE_CHOICES = ("off", "on", "both")
COMPILED_SUFFIX = " [torch.compile]"


def build_steps(spec: str, device: str, batch: int, precision: str, img_size: int, compiled: bool = False):
    """The model ``spec`` on random images: ``(infer, make_train_step)``.

    ``infer()`` runs one inference call (eval mode, ``torch.inference_mode``, the precision's
    autocast); ``make_train_step()`` puts the model in training mode and returns ``train_step()``:
    forward, cross-entropy, backward and an AdamW step (GradScaler with fp16 autocast). With
    ``compiled`` the calls go through ``torch.compile`` of the model (compiled on the first call of
    each mode).
    """
    import timm
    import torch

    import vmamba2d  # noqa: F401  (registers the vmamba models)

    torch.manual_seed(0)
    autocast_dtype = {"fp32": None, "bf16": torch.bfloat16,
                      "amp": torch.bfloat16 if device == "cpu" else torch.float16}[precision]
    name, model_kwargs = parse_model_spec(spec)
    model = timm.create_model(name, num_classes=1000, **model_kwargs).to(device)
    run = torch.compile(model) if compiled else model
    images = torch.randn(batch, 3, img_size, img_size, device=device)
    targets = torch.randint(0, 1000, (batch,), device=device)
    autocast = torch.autocast(device_type=device, dtype=autocast_dtype or torch.bfloat16,
                              enabled=autocast_dtype is not None)
    model.eval()

    def infer():
        with torch.inference_mode(), autocast:
            run(images)

    def make_train_step():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler(device, enabled=autocast_dtype == torch.float16)  # bf16 needs none

        def train_step():
            with autocast:
                loss = torch.nn.functional.cross_entropy(run(images), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)

        return train_step

    return infer, make_train_step


MALLOC_SETTINGS = ("keep", "default")


def apply_malloc_setting(setting: str) -> None:
    """``keep``: :func:`vmamba2d.cpu_malloc.keep_freed_memory` for this process; ``default``: glibc's own."""
    if setting not in MALLOC_SETTINGS:
        raise ValueError(f"malloc setting must be one of {MALLOC_SETTINGS}, got {setting!r}")
    if setting == "keep":
        from vmamba2d.cpu_malloc import keep_freed_memory

        keep_freed_memory()


def describe_malloc(setting: str) -> str:
    """The header's words for a malloc setting of the workers."""
    if setting == "keep":
        return "freed memory kept for reuse (vmamba2d.cpu_malloc.keep_freed_memory() in each worker; glibc only)"
    return "the C library's defaults (glibc: large blocks mapped afresh and unmapped when freed)"


def run_worker(args: argparse.Namespace) -> dict:
    """Measure one (model, batch, precision) in this process; returns the result row."""
    import torch

    apply_malloc_setting(args.malloc)

    device, batch = args.device, args.batch_size
    compiled = args.compile == "on"
    infer, make_train_step = build_steps(args.model, device, batch, args.precision, args.img_size, compiled)
    # a compiled model compiles in its first call: at least one untimed call
    warmup = max(args.warmup, 1) if compiled else args.warmup
    infer_s = _timed(infer, args.iters, warmup, device)
    infer_peak = _peak_memory_mb(device)

    label = args.model + (COMPILED_SUFFIX if compiled else "")
    row = dict(model=label, device=device, precision=args.precision, batch=batch,
               infer_img_s=batch / infer_s, infer_peak_mb=infer_peak)
    gpu_profile = args.profile and device == "cuda"
    if args.profile and not gpu_profile:
        row["profile"] = _profile_inference(infer)
    if gpu_profile:
        from gpu_time import profile_step  # benchmarks/gpu_time.py, beside this script

        row["gpu_profile"] = {"one inference call": profile_step(infer).as_dict()}
    if not args.no_train:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        train_step = make_train_step()
        train_s = _timed(train_step, args.iters, warmup, device)
        row.update(train_img_s=batch / train_s, train_peak_mb=_peak_memory_mb(device))
        if gpu_profile:
            row["gpu_profile"]["one training step"] = profile_step(train_step).as_dict()
    return row


def _best_of(old: dict, new: dict) -> dict:
    """Per field, the higher throughput and the lower peak memory of two measurements of one row."""
    merged = dict(old)
    for key, value in new.items():
        if key.endswith("_img_s"):
            merged[key] = max(old[key], value)
        elif key.endswith("_peak_mb"):
            merged[key] = min(old[key], value)
    return merged


def _spawn(model: str, batch: int, precision: str, args: argparse.Namespace, compiled: bool = False) -> dict:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", "--models", model, "--device", args.device,
        "--batch-sizes", str(batch), "--precisions", precision, "--iters", str(args.iters),
        "--warmup", str(args.warmup), "--img-size", str(args.img_size), "--malloc", args.malloc,
        "--compile", "on" if compiled else "off",
    ] + (["--no-train"] if args.no_train or batch not in args.train_batch_sizes else []) + (
        ["--profile"] if args.profile else [])
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        what = f"{model}{COMPILED_SUFFIX if compiled else ''} batch {batch} {precision}"
        raise RuntimeError(f"worker for {what} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def describe_run(device: str) -> list[str]:
    """Markdown bullet lines: date, commit, machine with its load, software, the scan backend."""
    import timm
    import torch

    import vmamba2d

    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=REPO)
        return out.stdout.strip() or "unknown"

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") != "unknown" else ""
    if device == "cuda":
        machine = f"{torch.cuda.get_device_name()} ({torch.cuda.device_count()} visible)"
        info = vmamba2d.ops.backend_info()
        scan_backend = f"{info['auto_cuda']} (CUDA kernels compiled by {info.get('cuda_compiler')})"
    else:
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
        info = vmamba2d.ops.backend_info()
        # The CPU kernel's build and whether it runs one channel per vector lane set the op's speed.
        scan_backend = f"{info['auto_cpu']} (CPU kernel build {info.get('cpu_isa')}, channel-lane kernels {'yes' if info.get('cpu_channel_lanes') else 'no'})"
    load = os.getloadavg()
    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- commit: {git('rev-parse', '--short', 'HEAD')}{dirty}",
        f"- machine: {machine}; load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}",
        f"- software: python {platform.python_version()}, torch {torch.__version__}, timm {timm.__version__}",
        f"- vmamba2d scan backend (auto): {scan_backend}",
    ]


def _header(args: argparse.Namespace) -> list[str]:
    return [f"# Model throughput ({args.device})", ""] + describe_run(args.device) + [
        f"- settings: input {args.img_size}x{args.img_size}, {args.warmup} warm-up + {args.iters} timed iterations, "
        f"fastest reported, best of {args.repeats} interleaved sweep(s), "
        "inference under torch.inference_mode, training step = forward + cross-entropy + backward + AdamW step, "
        "one fresh process per (model, batch, precision)",
        f"- peak memory: {'torch.cuda.max_memory_allocated' if args.device == 'cuda' else 'peak RSS of the worker process (weights, activations, allocator caches, Python)'}",
        f"- CPU malloc: {describe_malloc(args.malloc)}",
    ]


ACCOUNT_MODES = {"fp32": "fp32", "bf16": "autocast-bf16", "amp": "autocast-fp16"}  # on CUDA


def account_estimates(spec: str, precision: str, batch: int, img_size: int) -> tuple[float, float]:
    """The byte account's roofline estimate of one CUDA inference call of ``spec`` (img/s): the scan
    op counted as a fused kernel moves it, and as its CUDA path runs it today. An estimate from
    bytes and GEMM peaks (vmamba2d.analysis.traffic), traced on fake tensors: no GPU needed."""
    from vmamba2d.analysis.traffic import account_timm_model, roofline_seconds

    name, kwargs = parse_model_spec(spec.removesuffix(COMPILED_SUFFIX))
    mode = ACCOUNT_MODES[precision]
    fused, cuda = (account_timm_model(name, mode, img_size, batch, view, **kwargs) for view in ("fused", "cuda"))
    return batch / roofline_seconds(fused), batch / roofline_seconds(cuda)


def _table(rows: list[dict]) -> list[str]:
    estimated = any("account_img_s" in r for r in rows)
    lines = [
        "| model | precision | batch | inference img/s | training img/s | inference peak MiB | training peak MiB |"
        + (" account roofline img/s, fused / CUDA path (estimate) |" if estimated else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if estimated else ""),
    ]
    for r in rows:
        train = f"{r['train_img_s']:.2f}" if "train_img_s" in r else "-"
        train_mem = f"{r['train_peak_mb']:.0f}" if "train_peak_mb" in r else "-"
        account = ""
        if estimated:
            account = " {:,.0f} / {:,.0f} |".format(*r["account_img_s"]) if "account_img_s" in r else " - |"
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['batch']} | {r['infer_img_s']:.2f} | {train} | "
            f"{r['infer_peak_mb']:.0f} | {train_mem} |{account}"
        )
    return lines


def _profile_tables(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if "gpu_profile" in r:
            from gpu_time import GpuTime, markdown_table

            lines += ["", f"## GPU time: {r['model']} {r['precision']} batch {r['batch']} (torch.profiler, kernels by kind)",
                      ""]
            for step, data in r["gpu_profile"].items():
                lines += markdown_table(step, GpuTime.from_dict(data)) + [""]
        if "profile" not in r:
            continue
        lines += ["", f"## Profile: {r['model']} {r['precision']} batch {r['batch']} (one inference call, self CPU time)", "",
                  f"route-copy operators ({', '.join(COPY_OPERATORS)}): {100 * r['profile']['copy_share']:.1f}%", "",
                  "| operator | share of self time |", "|---|---|"]
        lines += [f"| {op} | {100 * share:.1f}% |" for op, share in r["profile"]["top"]]
    return lines


def _fused_route_targets(rows: list[dict], device: str) -> list[str]:
    """Each ``MODEL:cross_scan=per_route`` row against the ``MODEL`` row (fused op) of its batch."""
    lookup = {(r["model"], r["precision"], r["batch"]): r for r in rows}
    lines = []
    for (spec, precision, batch), per_route in sorted(lookup.items()):
        name, kwargs = parse_model_spec(spec)
        fused = lookup.get((name, precision, batch))
        if kwargs != {"cross_scan": "per_route"} or fused is None:
            continue
        ratio = fused["infer_img_s"] / per_route["infer_img_s"]
        lines.append(f"- {name} {precision} batch {batch}: fused / per-route inference = {ratio:.2f}x "
                     f"(target >= 1.3x): {'met' if ratio >= 1.3 else 'NOT met'}")
        if "train_img_s" in fused and "train_img_s" in per_route:
            ratio = fused["train_img_s"] / per_route["train_img_s"]
            lines.append(f"- {name} {precision} batch {batch}: fused / per-route training = {ratio:.2f}x "
                         f"(target >= 1.2x): {'met' if ratio >= 1.2 else 'NOT met'}")
        for phase in ("infer", "train"):
            key = f"{phase}_peak_mb"
            if key in fused and key in per_route:
                lower = fused[key] < per_route[key]
                lines.append(f"- {name} {precision} batch {batch}: {phase} peak memory fused {fused[key]:.0f} MiB vs "
                             f"per-route {per_route[key]:.0f} MiB (target lower): {'met' if lower else 'NOT met'}")
        convnext = lookup.get(("convnext_tiny", precision, batch))
        if device == "cpu" and convnext and batch >= 8 and name.endswith("_tiny"):
            ratio = fused["infer_img_s"] / convnext["infer_img_s"]
            lines.append(f"- {name} {precision} batch {batch}: {name} / convnext_tiny inference = {ratio:.2f}x "
                         f"(target >= 1.0x): {'met' if ratio >= 1.0 else 'NOT met'}")
    return lines


def _targets(rows: list[dict], device: str) -> list[str]:
    lookup = {(r["model"], r["precision"], r["batch"]): r["infer_img_s"] for r in rows}
    lines = ["", "## Targets (inference throughput)", ""] + _fused_route_targets(rows, device)
    for (model, precision, batch), ours in sorted(lookup.items()):
        if model != "vmamba2d_tiny":
            continue
        baseline = lookup.get(("vmamba_tiny", precision, batch))
        convnext = lookup.get(("convnext_tiny", precision, batch))
        if device == "cpu":
            if baseline:
                ok = ours * 1.5 >= baseline
                lines.append(f"- batch {batch}: vmamba_tiny / vmamba2d_tiny = {baseline / ours:.2f}x (target <= 1.5x): {'met' if ok else 'NOT met'}")
            if convnext:
                ok = ours * 3 >= convnext
                lines.append(f"- batch {batch}: convnext_tiny / vmamba2d_tiny = {convnext / ours:.2f}x (target <= 3x): {'met' if ok else 'NOT met'}")
        else:
            if baseline:
                ok = ours >= 0.9 * baseline
                lines.append(f"- {precision} batch {batch}: vmamba2d_tiny / vmamba_tiny = {ours / baseline:.2f} (target >= 0.9): {'met' if ok else 'NOT met'}")
            if convnext:
                lines.append(f"- {precision} batch {batch}: vmamba2d_tiny / convnext_tiny = {ours / convnext:.2f} (for reference, no target)")
            if precision == "fp32":
                ok = ours > PUBLISHED_VMAMBA_T_IMG_S
                lines.append(f"- fp32 batch {batch}: vmamba2d_tiny {ours:.0f} img/s vs VMamba-T published {PUBLISHED_VMAMBA_T_IMG_S} img/s (A100): {'above' if ok else 'NOT above'}")
    return lines


def emit(text: str, out: Path | None) -> None:
    """Prints the report; with ``out`` also writes it there atomically (a temporary file renamed)."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        temporary = out.with_suffix(out.suffix + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="default: 1 16 on CPU, 128 on GPU")
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16", "amp"],
                        help="bf16: bf16 autocast; amp: fp16 autocast + GradScaler on GPU, bf16 on CPU "
                             "(default: fp32 on CPU, fp32 bf16 on GPU)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations before timing")
    parser.add_argument("--repeats", type=int, default=1, help="whole sweeps to run; the best of them is reported")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--no-train", action="store_true", help="measure inference only")
    parser.add_argument("--train-batch-sizes", nargs="+", type=int,
                        help="batch sizes that also get a training measurement (default: all of --batch-sizes)")
    parser.add_argument("--profile", action="store_true",
                        help="add torch.profiler's top operators of one inference call per row (CPU), or the "
                             "GPU time by kernel kind of one inference call and one training step (CUDA)")
    parser.add_argument("--malloc", choices=MALLOC_SETTINGS, default="keep",
                        help="keep: glibc keeps freed memory for reuse in each worker (default); default: its own thresholds")
    parser.add_argument("--account", action="store_true",
                        help="on a GPU, put the byte account's roofline estimate beside each row (traced on the CPU, "
                             "a few seconds per model)")
    parser.add_argument("--compile", choices=COMPILE_CHOICES, default="off",
                        help="run the models under torch.compile: off (default), on, or both eager and compiled rows")
    parser.add_argument("--out", type=Path, help="also write the markdown table to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iters < 1 or args.repeats < 1 or args.warmup < 0 or args.img_size < 32 or args.img_size % 32:
        parser.error("--iters and --repeats must be >= 1, --warmup >= 0, --img-size a positive multiple of 32")
    args.batch_sizes = args.batch_sizes or ([128] if args.device == "cuda" else [1, 16])
    args.train_batch_sizes = args.train_batch_sizes or args.batch_sizes
    args.precisions = args.precisions or (["fp32", "bf16"] if args.device == "cuda" else ["fp32"])
    if any(b < 1 for b in args.batch_sizes):
        parser.error("--batch-sizes must be positive")
    for spec in args.models:
        try:
            parse_model_spec(spec)
        except ValueError as err:
            parser.error(f"--models: {err}")

    if args.worker:
        args.model, args.batch_size, args.precision = args.models[0], args.batch_sizes[0], args.precisions[0]
        print(json.dumps(run_worker(args)))
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a GPU")
    lines = _header(args)
    best: dict = {}
    compile_modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]
    for _ in range(args.repeats):  # whole sweeps, so load changes hit every model alike
        for precision in args.precisions:
            for batch in args.batch_sizes:
                for model in args.models:
                    for compiled in compile_modes:
                        row = _spawn(model, batch, precision, args, compiled)
                        print(f"{row['model']} {precision} batch {batch}: {row['infer_img_s']:.2f} img/s inference",
                              file=sys.stderr)
                        key = (row["model"], precision, batch)
                        best[key] = _best_of(best[key], row) if key in best else row
    load = os.getloadavg()  # with the start's in the header: how busy the machine was meanwhile
    lines += [f"- load average at end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}", ""]
    rows = list(best.values())
    if args.device == "cuda" and args.account:
        for row in rows:
            row["account_img_s"] = account_estimates(row["model"], row["precision"], row["batch"], args.img_size)
    lines += _table(rows) + _targets(rows, args.device) + _profile_tables(rows)
    text = "\n".join(lines) + "\n"
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
