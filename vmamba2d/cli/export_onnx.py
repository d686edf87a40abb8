"""Export a model of the zoo to a standard ONNX file (runs in onnxruntime, TensorRT, OpenVINO).

Examples:

    vmamba2d-export-onnx vmamba2d_tiny out/vmamba2d_tiny.onnx --check
    vmamba2d-export-onnx vmamba_small out/vmamba_s.onnx --checkpoint w.pth --dynamic --check
    vmamba2d-export-onnx vmamba2d_tiny out/backbone.onnx --features-only --img-size 512 512
    vmamba2d-export-onnx vmamba2d_tiny out/ft.onnx --checkpoint ft.pth --model-kwargs num_classes=10
    vmamba2d-export-onnx mambamil2d out/slide.onnx --checkpoint runs/bracs/seed0/best.pth --check

The file takes ``image`` (batch, 3, H, W) with a dynamic batch; H and W are fixed at --img-size
unless --dynamic. ``mambamil2d`` (2DMambaMIL; --checkpoint a MIL checkpoint, or --model-kwargs
in_dim=... num_classes=... for random weights) gives a file of one slide: ``features`` (n, in_dim)
and ``coords`` (n, 2) int64, n dynamic, the grid read from the coords (vmamba2d.export.mil_onnx).
The scan ops are written with standard ONNX operators (no custom domain, no plugin). The export
runs ``onnx.checker``; --check also runs onnxruntime on random inputs (images: batch 1 and 2, and
another size with --dynamic; slides: two bags) and prints the max relative error against eager
PyTorch, exiting with status 1 above 1e-4. Needs the onnx extra: pip install "vmamba2d[onnx]".
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from vmamba2d.export.mil_onnx import (
    COORDS_NAME, FEATURES_NAME, export_mil_onnx, mil_max_relative_error, random_bag,
)
from vmamba2d.export.onnx_export import (
    INPUT_NAME, MIN_OPSET, MissingOnnxExtraError, export_onnx, max_relative_error, onnx_session, require_onnx_extra,
)
from vmamba2d.runs.options import parse_key_values

TOLERANCE = 1e-4  # max relative error of --check (fp32)
MODEL_PREFIXES = ("vmamba2d_", "vmamba_")
MIL_MODEL = "mambamil2d"
DEFAULT_IMG_SIZE = (224, 224)
IMAGE_ONLY_OPTIONS = ("img_size", "features_only", "dynamic")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help=f"model name, e.g. vmamba2d_tiny or vmamba_base, or {MIL_MODEL}")
    parser.add_argument("out", help="ONNX file to write")
    parser.add_argument("--img-size", type=int, nargs=2, default=None, metavar=("H", "W"),
                        help="input height and width (default 224 224)")
    parser.add_argument("--checkpoint", default=None,
                        help=f"weights to load (as timm's pretrained file; for {MIL_MODEL} a MIL checkpoint)")
    parser.add_argument("--model-kwargs", nargs="+", default=[], metavar="KEY=VALUE",
                        help="model arguments, values as YAML (e.g. num_classes=10 routes=corners)")
    parser.add_argument("--features-only", action="store_true", help="export the backbone's four stage maps")
    parser.add_argument("--opset", type=int, default=None,
                        help=f"ONNX opset, at least {MIN_OPSET} (default: the exporter's)")
    parser.add_argument("--dynamic", action="store_true", help="dynamic height and width (batch is always dynamic)")
    parser.add_argument("--check", action="store_true",
                        help="run onnxruntime on random inputs and compare with eager PyTorch")
    parser.add_argument("--bench", type=int, nargs="+", default=[], metavar="SIZE",
                        help=f"time onnxruntime and eager PyTorch (CPU) at these batch sizes ({MIL_MODEL}: "
                             "bag sizes, patches on the smallest square grid holding them)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for --bench, both runtimes (default: torch's)")
    parser.add_argument("--iters", type=int, default=3, help="timed runs per batch size and runtime (--bench)")
    args = parser.parse_args(argv)
    if args.model == MIL_MODEL:
        given = [f"--{name.replace('_', '-')}" for name in IMAGE_ONLY_OPTIONS if getattr(args, name)]
        if given:
            parser.error(f"{' '.join(given)}: image models only, not {MIL_MODEL}")
        if args.checkpoint is not None and args.model_kwargs:
            parser.error(f"{MIL_MODEL}: --checkpoint (it holds the model's config) or --model-kwargs, not both")
        if min(args.bench, default=2) < 2:
            parser.error(f"{MIL_MODEL}: --bench bag sizes must be at least 2 patches, got {args.bench}")
    elif not args.model.startswith(MODEL_PREFIXES):
        parser.error(f"model must be one of the zoo's vmamba2d_* / vmamba_* models or {MIL_MODEL}, got {args.model!r}")
    args.img_size = tuple(args.img_size or DEFAULT_IMG_SIZE)
    if min(args.img_size) < 1:
        parser.error(f"--img-size must be two positive ints (H W), got {args.img_size}")
    if args.opset is not None and args.opset < MIN_OPSET:
        parser.error(f"--opset must be at least {MIN_OPSET} (the scan translations' opset), got {args.opset}")
    if min(args.bench, default=1) < 1 or args.iters < 1 or (args.threads is not None and args.threads < 1):
        parser.error("--bench batch sizes, --iters and --threads must be positive")
    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        parser.error(f"--checkpoint must be an existing file, got {args.checkpoint!r}")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        parser.error(f"out must be a file in an existing folder, got {args.out!r}"
                     + (" (a folder)" if out.is_dir() else f" (no folder {out.parent})"))
    try:
        args.model_kwargs = parse_key_values(args.model_kwargs, "--model-kwargs")
    except ValueError as error:
        parser.error(str(error))
    return args


def create_model(args: argparse.Namespace) -> torch.nn.Module:
    """The model named by ``args.model`` (eval mode) with ``args.checkpoint`` loaded: a timm model,
    or 2DMambaMIL from a MIL checkpoint or ``args.model_kwargs``."""
    if args.model == MIL_MODEL:
        from vmamba2d.mil.models import build_model, model_from_checkpoint

        if args.checkpoint is not None:
            try:
                model = model_from_checkpoint(args.checkpoint)
            except ValueError as error:
                raise SystemExit(f"error: {error}") from error
            if model.model_name != MIL_MODEL:
                raise SystemExit(f"error: {args.checkpoint} holds a {model.model_name!r} model, not {MIL_MODEL!r}")
            return model.eval()
        try:
            return build_model(MIL_MODEL, **args.model_kwargs).eval()
        except TypeError as error:
            raise SystemExit(f"error: {MIL_MODEL} needs --model-kwargs in_dim=... num_classes=... "
                             f"(or a --checkpoint): {error}") from error
    import timm

    import vmamba2d.models  # noqa: F401  (registers the models with timm)

    kwargs = dict(args.model_kwargs, **({"features_only": True} if args.features_only else {}))
    if args.checkpoint is not None:
        kwargs.update(pretrained=True, pretrained_cfg_overlay=dict(file=args.checkpoint))
    if args.model not in timm.list_models(MODEL_PREFIXES[0] + "*") + timm.list_models(MODEL_PREFIXES[1] + "*"):
        raise SystemExit(f"error: unknown model {args.model!r}")
    return timm.create_model(args.model, **kwargs).eval()


def check(model: torch.nn.Module, path: Path, img_size: tuple[int, int], dynamic: bool) -> float:
    """Max relative error of the file against ``model`` on random images; prints one line each."""
    height, width = img_size
    cases = [(1, height, width), (2, height, width)]
    if dynamic:
        cases.append((1, height + 32, width + 16))
    session = onnx_session(path)
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for batch, h, w in cases:
        images = torch.randn(batch, 3, h, w, generator=generator)
        error = max_relative_error(model, path, images, session)
        print(f"onnxruntime vs eager, batch {batch}, {h}x{w}: max relative error {error:.2e}")
        worst = max(worst, error)
    return worst


def check_mil(model: torch.nn.Module, path: Path) -> float:
    """Max relative error of a slide model's file against ``model`` on two random bags; prints one
    line each."""
    session = onnx_session(path)
    worst = 0.0
    for patches, grid in ((12, (5, 3)), (40, (6, 9))):
        features, coords = random_bag(model.in_dim, patches, grid, seed=patches)
        error = mil_max_relative_error(model, path, features, coords, session)
        print(f"onnxruntime vs eager, {patches} patches on a {grid[0]}x{grid[1]} grid: max relative error {error:.2e}")
        worst = max(worst, error)
    return worst


def _fastest(run, iters: int) -> float:
    """Seconds of the fastest of ``iters`` calls of ``run`` after one warm-up call."""
    run()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def bench(model: torch.nn.Module, path: Path, img_size: tuple[int, int], batches: list[int],
          threads: int | None, iters: int) -> None:
    """Prints img/s of onnxruntime and of eager PyTorch (inference mode) for each batch size,
    the two runtimes timed back to back on the same images, with the same number of threads."""
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    session = onnx_session(path, threads=threads)
    for batch in batches:
        images = torch.randn(batch, 3, *img_size, generator=torch.Generator().manual_seed(0))
        feeds = {INPUT_NAME: images.numpy()}
        with torch.inference_mode():
            eager = _fastest(lambda: model(images), iters)
        onnx = _fastest(lambda: session.run(None, feeds), iters)
        print(f"batch {batch}, {img_size[0]}x{img_size[1]}, {threads} threads: onnxruntime "
              f"{batch / onnx:.2f} img/s, eager PyTorch {batch / eager:.2f} img/s "
              f"(onnxruntime / eager = {eager / onnx:.2f}x)")


def bench_mil(model: torch.nn.Module, path: Path, bags: list[int], threads: int | None, iters: int) -> None:
    """Prints the time of one slide in onnxruntime and in eager PyTorch (inference mode) for each
    bag size (random patches on the smallest square grid holding them), back to back on the same
    inputs, with the same number of threads."""
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    session = onnx_session(path, threads=threads)
    for patches in bags:
        side = math.isqrt(patches - 1) + 1
        features, coords = random_bag(model.in_dim, patches, (side, side))
        feeds = {FEATURES_NAME: features.numpy(), COORDS_NAME: coords.numpy()}
        with torch.inference_mode():
            eager = _fastest(lambda: model(features, coords), iters)
        onnx = _fastest(lambda: session.run(None, feeds), iters)
        print(f"{patches} patches on a {side}x{side} grid, {threads} threads: onnxruntime {onnx * 1e3:.1f} ms, "
              f"eager PyTorch {eager * 1e3:.1f} ms per slide (onnxruntime / eager = {eager / onnx:.2f}x)")


def _one_line(error: BaseException) -> str:
    """``'<Type>: <cause>'`` of a model-building error, without torch's multi-line advice."""
    advice = ("Weights only load failed", "Check the documentation", "Please file an issue", "(1)", "(2)")
    lines = [line.split("WeightsUnpickler error:", 1)[-1].strip() for line in str(error).splitlines()]
    causes = [line for line in lines if line and not line.startswith(advice)]
    cause = causes[0] if causes else ""
    if len(causes) > 1 and cause.endswith(":"):  # e.g. 'Error(s) in loading state_dict for VMamba:'
        cause = f"{cause} {causes[1]}"
    return f"{type(error).__name__}: {cause}".rstrip(": ")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        require_onnx_extra()
    except MissingOnnxExtraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import onnx

    if args.opset is not None and args.opset > onnx.defs.onnx_opset_version():
        print(f"error: --opset {args.opset}: the installed onnx knows opsets up to "
              f"{onnx.defs.onnx_opset_version()}", file=sys.stderr)
        return 2
    try:
        model = create_model(args)
    except (RuntimeError, TypeError, ValueError, KeyError, EOFError, OSError) as error:
        # unreadable, refused or foreign checkpoints, wrong shapes, unknown or bad model arguments
        print(f"error: {args.model}{' --checkpoint ' + args.checkpoint if args.checkpoint else ''}: "
              f"{_one_line(error)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    if args.model == MIL_MODEL:
        path = export_mil_onnx(model, args.out, opset=args.opset)
        inputs = f"inputs 'features' (n, {model.in_dim}) and 'coords' (n, 2) int64, n dynamic, grid from coords"
    else:
        path = export_onnx(model, args.out, args.img_size, dynamic_size=args.dynamic, opset=args.opset)
        size = "dynamic" if args.dynamic else f"{args.img_size[0]}x{args.img_size[1]}"
        inputs = f"input 'image' (batch, 3, H, W), batch dynamic, H x W {size}"
    seconds = time.perf_counter() - start
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {seconds:.1f} s: {inputs}; onnx.checker passed")
    if args.check:
        if args.model == MIL_MODEL:
            worst = check_mil(model, path)
        else:
            worst = check(model, path, args.img_size, args.dynamic)
        if worst > TOLERANCE:
            print(f"error: max relative error {worst:.2e} above {TOLERANCE:g}", file=sys.stderr)
            return 1
    if args.bench and args.model == MIL_MODEL:
        bench_mil(model, path, args.bench, args.threads, args.iters)
    elif args.bench:
        bench(model, path, args.img_size, args.bench, args.threads, args.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
