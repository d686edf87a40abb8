"""vmamba2d in a few minutes on a CPU: the op, the model, an image, and the ERF figure in miniature.

Examples:

    vmamba2d-demo                        # random init (what `make demo` runs)
    vmamba2d-demo --checkpoint w.pth     # ImageNet top-5 on the bundled image

1. The 2D selective scan on a model-sized input (batch 2, dim 384, 4 groups, N=1, 56x56) on the
   active backend: which backend ran and its forward / forward+backward time.
2. vmamba2d_tiny built through timm: parameters, FLOPs at 224 and the scan backend it uses.
3. The bundled image through it: top-5 classes with --checkpoint, feature-map shapes otherwise.
4. ERFs of vmamba_tiny (1D scans) vs vmamba2d_tiny (2D scans) at random init, into a PNG:
   row 1, the whole backbones (RepLKNet's definition); row 2, one SS2D mixer of each on a log
   scale, where the routing of the scans shows (VMamba's cross vs 2DVMamba's 2D spread).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import vmamba2d
import vmamba2d.models  # noqa: F401  (registers the timm models)
from vmamba2d import cpu_malloc, erf
from vmamba2d.ops import backend_info, resolve_backend, selective_scan_2d

MIXER_DECADES = 5.0
DEMO_IMAGE = Path(vmamba2d.__file__).resolve().parent / "assets" / "demo_landscape.jpg"


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def timed(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def demo_op(repeats: int) -> None:
    section("1. the 2D selective scan")
    print("backend_info():", backend_info())
    batch, dim, groups, nstate, side = 2, 384, 4, 1, 56
    length = side * side
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(batch, dim, length, generator=gen, requires_grad=True)
    delta = (0.5 * torch.randn(batch, dim, length, generator=gen)).requires_grad_(True)
    A = -torch.rand(dim, nstate, generator=gen) - 0.5
    B = torch.randn(batch, groups, nstate, length, generator=gen)
    C = torch.randn(batch, groups, nstate, length, generator=gen)
    D = torch.ones(dim)
    delta_bias = torch.full((dim,), -4.0)
    backend = resolve_backend("auto", u.device)

    def forward():
        with torch.no_grad():
            selective_scan_2d(u, delta, A, B, C, D, delta_bias, height=side, width=side, backend=backend)

    def forward_backward():
        y = selective_scan_2d(u, delta, A, B, C, D, delta_bias, height=side, width=side, backend=backend)
        y.sum().backward()

    fwd_ms, fwd_bwd_ms = timed(forward, repeats), timed(forward_backward, repeats)
    print(f"input u ({batch}, {dim}, {side}x{side}), {groups} groups, N={nstate}, "
          f"{torch.get_num_threads()} threads")
    print(f"backend {backend!r}: forward {fwd_ms:.1f} ms, forward+backward {fwd_bwd_ms:.1f} ms")


def demo_model(checkpoint: str | None):
    import timm

    section("2. vmamba2d_tiny through timm")
    kwargs = dict(pretrained=True, pretrained_cfg_overlay=dict(file=checkpoint)) if checkpoint else {}
    model = timm.create_model("vmamba2d_tiny", **kwargs).eval()
    params = sum(p.numel() for p in model.parameters())
    flops = vmamba2d.count_flops(model, (3, 224, 224))
    print(f"weights: {checkpoint or 'random init'}")
    print(f"params {params / 1e6:.2f} M, FLOPs @224 {flops / 1e9:.2f} G (fvcore, 2D-scan handle included)")
    print(f"scan backend on CPU: {resolve_backend('auto', torch.device('cpu'))!r}")
    return model


def demo_image(model, image_path: Path, with_weights: bool) -> None:
    import timm
    from PIL import Image

    section("3. the bundled image")
    config = timm.data.resolve_data_config({}, model=model)
    transform = timm.data.create_transform(**config)
    with Image.open(image_path) as image:
        batch = transform(image.convert("RGB")).unsqueeze(0)
    print(f"{image_path} -> {tuple(batch.shape)}")
    with torch.no_grad():
        first = time.perf_counter()
        if with_weights:
            probabilities = model(batch).softmax(dim=-1)[0]
        else:
            features = model.forward_intermediates(batch, intermediates_only=True)
        second = time.perf_counter()
        model(batch)
        elapsed = time.perf_counter() - second, second - first
    if with_weights:
        info = timm.data.ImageNetInfo()
        top = probabilities.topk(5)
        for p, index in zip(top.values.tolist(), top.indices.tolist()):
            print(f"  {100 * p:5.1f}%  {index:4d} {info.index_to_description(index)}")
    else:
        print("no --checkpoint: random weights, so no classes; the four stage feature maps:")
        for stage, feature in enumerate(features):
            print(f"  stage {stage}: {tuple(feature.shape)}")
    print(f"forward at 224: {1000 * elapsed[0]:.0f} ms (first call, with warm-up: {1000 * elapsed[1]:.0f} ms)")


def demo_erf(out: Path, input_size: int, num_images: int, mixer_size: int, mixer_maps_count: int) -> Path:
    section("4. effective receptive fields at random init")
    names = ("vmamba_tiny", "vmamba2d_tiny")
    results, heatmaps, titles = {}, [], []
    for name in names:
        torch.manual_seed(0)
        model = erf.create_feature_model(name, input_size)
        start = time.perf_counter()
        results[name] = erf.compute_erf(model, erf.synthetic_images(num_images, input_size, seed=0),
                                        batch_size=num_images, progress=name, total=num_images)
        print(f"{name}: {num_images} images at {input_size}px in {time.perf_counter() - start:.1f} s")
        heatmaps.append(erf.normalized_heatmap(results[name].mean_map))
        titles.append(f"{name}: whole backbone\nlog10(x+1)/max, {input_size}px, random init")
    mixer_maps = {}
    for name, scan in zip(names, ("1d", "2d")):
        torch.manual_seed(0)  # the same weights for both mixers: only the scan differs
        mixer = vmamba2d.models.SS2D(96, scan=scan)
        inputs = erf.random_feature_maps(mixer_maps_count, 96, mixer_size, seed=0)
        mixer_maps[name] = erf.compute_erf(mixer, inputs, batch_size=mixer_maps_count).mean_map
        heatmaps.append(erf.log_heatmap(mixer_maps[name], decades=MIXER_DECADES))
        titles.append(f"{name}: one SS2D mixer ({scan} scan)\n"
                      f"log10(x/max), {MIXER_DECADES:g} decades, {mixer_size}x{mixer_size}, random init")
    path = erf.plot_erf_grid(heatmaps, titles, out / "erf_demo.png", columns=2,
                             colorbar_label="normalised contribution (scale in titles)")
    rows = erf.area_ratio_rows(results)
    for row, name in zip(rows, names):
        row["cross_mass"] = erf.axis_mass_fraction(results[name].mean_map, 1, exclude_radius=3)
        row["mixer_cross_mass"] = erf.axis_mass_fraction(mixer_maps[name], 1, exclude_radius=3)
    print("\nhigh-contribution area ratios (whole backbones) and cross_mass = share of the ERF within")
    print("1 px of the centre row/column, outside the central 7x7 (backbone; one SS2D mixer):\n")
    print(erf.markdown_table(rows))
    erf.write_tables(rows, out, stem="erf_demo")
    print("At random init a scan's long-range terms are small next to the local ones (dt * B * C per")
    print("pixel, about 1e-3 of the D * u skip), so the stem, downsampling and depthwise convolutions")
    print("shape both backbones' ERFs and they nearly coincide. One mixer on a log scale shows the")
    print("routing that training builds on: VMamba's 1D scans carry information along the centre row and")
    print("column (a cross); the 2D scan spreads it over whole quadrants (the four routes start at two")
    print("opposite corners, so one mixer covers the top-left and bottom-right quadrants).")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None, help="vmamba2d_tiny weights for the top-5")
    parser.add_argument("--image", default=str(DEMO_IMAGE), help="image to classify")
    parser.add_argument("--erf-size", type=int, default=128, help="backbone ERF input side (multiple of 32)")
    parser.add_argument("--erf-images", type=int, default=2, help="images averaged per ERF")
    parser.add_argument("--mixer-size", type=int, default=56, help="side of the SS2D mixer's input map")
    parser.add_argument("--mixer-maps", type=int, default=8, help="random feature maps averaged per mixer ERF")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the op")
    parser.add_argument("--out", default="out/demo", help="output folder")
    args = parser.parse_args(argv)
    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        parser.error(f"--checkpoint must be an existing file, got {args.checkpoint!r}")
    if args.erf_size < 32:
        parser.error(f"--erf-size must be at least 32 (the last stage's map is erf_size / 32), got {args.erf_size}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cpu_malloc.keep_freed_memory()  # as the training scripts do on CPU: no fresh mapping per tensor
    print("cpu_malloc_info():", cpu_malloc.cpu_malloc_info())
    start = time.perf_counter()
    demo_op(args.repeats)
    model = demo_model(args.checkpoint)
    demo_image(model, Path(args.image), with_weights=args.checkpoint is not None)
    del model
    path = demo_erf(Path(args.out), args.erf_size, args.erf_images, args.mixer_size, args.mixer_maps)
    print(f"\nERF figure: {path.resolve()}")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
