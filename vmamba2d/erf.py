"""Effective receptive field (ERF) of a backbone, RepLKNet's definition (docs/models.md).

For each image resized to S x S, the model's last-stage feature map (batch, C, h, w) gives the
scalar ``sum_c ReLU(feature[:, c, h // 2, w // 2])``; its gradient w.r.t. the input image is
passed through ReLU and summed over the input channels, giving an (S, S) contribution map. Maps
are averaged over the images (maps containing NaN are skipped and counted). The heatmap shown is
``log10(map + 1) / max``; the "high-contribution area ratio" is the area of the smallest centred
square holding a fraction t of the heatmap's total, as a fraction of the image area.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import nn

Tensor = torch.Tensor

ERF_THRESHOLDS = (0.2, 0.3, 0.5, 0.99)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


class LastStageFeatures(nn.Module):
    """Wraps a timm ``features_only`` network so that it returns its last map as NCHW.

    ``forward(images (batch, 3, S, S)) -> (batch, C, h, w)``; timm models whose feature maps are
    channels-last (e.g. Swin, ``output_fmt == "NHWC"``) are permuted to channels-first.
    """

    def __init__(self, features: nn.Module):
        super().__init__()
        self.features = features
        self.channels_last = str(getattr(features, "output_fmt", "NCHW")).endswith("NHWC")

    def forward(self, images: Tensor) -> Tensor:
        maps = self.features(images)
        last = maps[-1] if isinstance(maps, (list, tuple)) else maps
        if last.ndim != 4:
            raise RuntimeError(f"expected a 4-D last-stage feature map, got shape {tuple(last.shape)}")
        return last.permute(0, 3, 1, 2) if self.channels_last else last


def create_feature_model(
    name: str,
    input_size: int,
    checkpoint: Optional[str] = None,
    pretrained: bool = False,
    model_kwargs: Optional[dict] = None,
) -> LastStageFeatures:
    """Builds timm model ``name`` returning its last-stage feature map, in eval mode.

    Args:
        name: any timm model name that supports ``features_only`` (importing vmamba2d registers
            ours).
        input_size: side S of the square inputs; passed as ``img_size`` to models that take it
            (Swin, ViT), others ignore it.
        checkpoint: optional weights file, loaded through timm's ``pretrained_cfg_overlay``.
        pretrained: load timm's default pretrained weights (ignored when ``checkpoint`` is set).
        model_kwargs: extra ``timm.create_model`` arguments (e.g. ``{"routes": "corners"}``).
    Returns:
        module mapping (batch, 3, S, S) images to (batch, C, h, w) features.
    """
    import timm

    import vmamba2d.models  # noqa: F401  (registers our models with timm)

    if checkpoint is not None and not Path(checkpoint).is_file():
        raise ValueError(f"checkpoint must be an existing file, got {checkpoint!r}")
    kwargs = dict(model_kwargs or {}, features_only=True, out_indices=(-1,),
                  pretrained=pretrained or checkpoint is not None)
    if checkpoint is not None:
        kwargs["pretrained_cfg_overlay"] = dict(file=str(checkpoint))
    try:
        features = timm.create_model(name, img_size=input_size, **kwargs)
    except TypeError as error:
        # Models with a fixed-size position embedding take img_size; convolutional ones reject it.
        if "img_size" not in str(error):
            raise
        features = timm.create_model(name, **kwargs)
    return LastStageFeatures(features).eval()


def synthetic_images(num_images: int, size: int, seed: int = 0) -> Iterator[Tensor]:
    """Yields ``num_images`` seeded natural-statistics images, each (3, size, size), normalised.

    Colour noise with a 1/f amplitude spectrum (the spectrum of natural images), rescaled to
    [0, 1] and normalised with the ImageNet mean/std - a stand-in when no image folder is given.
    """
    generator = torch.Generator().manual_seed(seed)
    fy = torch.fft.fftfreq(size).abs()[:, None]
    fx = torch.fft.rfftfreq(size)[None, :]
    amplitude = 1.0 / torch.clamp(torch.sqrt(fx**2 + fy**2), min=1.0 / size)
    mean, std = _imagenet_mean_std()
    for _ in range(num_images):
        phase = torch.rand(3, size, size // 2 + 1, generator=generator) * (2 * math.pi)
        spectrum = amplitude * torch.polar(torch.ones_like(phase), phase)
        image = torch.fft.irfft2(spectrum, s=(size, size))
        low = image.amin(dim=(1, 2), keepdim=True)
        high = image.amax(dim=(1, 2), keepdim=True)
        image = (image - low) / (high - low)
        yield (image - mean) / std


def folder_images(folder: str, num_images: int, size: int) -> Iterator[Tensor]:
    """Yields up to ``num_images`` images from ``folder`` (recursively, sorted by path).

    Each is converted to RGB, resized to (size, size) with bicubic interpolation, scaled to
    [0, 1] and normalised with the ImageNet mean/std: a (3, size, size) float tensor.
    """
    from PIL import Image

    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"data must be an existing folder of images, got {folder!r}")
    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not paths:
        raise ValueError(f"data folder {folder!r} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    mean, std = _imagenet_mean_std()
    for path in paths[:num_images]:
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((size, size), Image.BICUBIC)
        pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1)
        yield (pixels - mean) / std


def _imagenet_mean_std() -> tuple[Tensor, Tensor]:
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    return (torch.tensor(IMAGENET_DEFAULT_MEAN).view(3, 1, 1),
            torch.tensor(IMAGENET_DEFAULT_STD).view(3, 1, 1))


def contribution_maps(model: nn.Module, images: Tensor) -> Tensor:
    """Per-image input-gradient maps of the central output position.

    Args:
        model: maps (batch, channels, S, S) inputs (images, or feature maps for a single layer)
            to a (batch, C, h, w) feature map.
        images: (batch, channels, S, S).
    Returns:
        (batch, S, S): ReLU(d scalar / d image) summed over the input channels, where
        scalar = sum over the batch and channels of ReLU(feature[:, :, h // 2, w // 2]). Images do
        not interact in an eval-mode backbone, so each map only depends on its own image.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be (batch, channels, S, S), got shape {tuple(images.shape)}")
    images = images.detach().requires_grad_(True)
    features = model(images)
    height, width = features.shape[-2:]
    central = torch.relu(features[:, :, height // 2, width // 2]).sum()
    (grad,) = torch.autograd.grad(central, images)
    return torch.relu(grad).sum(dim=1)


@dataclass
class ERFResult:
    """Mean contribution map (S, S) float64, and how many images were used / skipped for NaN."""

    mean_map: np.ndarray
    num_used: int
    num_nan: int


def compute_erf(
    model: nn.Module,
    images: Iterable[Tensor],
    device: str | torch.device = "cpu",
    batch_size: int = 1,
    progress: Optional[str] = None,
    total: Optional[int] = None,
) -> ERFResult:
    """Averages ``contribution_maps`` over ``images`` (each (channels, S, S)), skipping NaN maps.

    Args:
        model: last-stage feature model (see ``create_feature_model``); its parameters are frozen
            for the duration (only input gradients are needed).
        images: iterable of (channels, S, S) tensors.
        device: where to run.
        batch_size: images per forward/backward pass.
        progress: a tqdm description; None for no progress bar.
        total: number of images, for the progress bar.
    Returns:
        ERFResult with the (S, S) mean map. Raises RuntimeError when every map was NaN.
    """
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model = model.to(device).eval()
    requires_grad = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    total_map: Optional[np.ndarray] = None
    num_used = num_nan = 0
    bar = tqdm(total=total, desc=progress, unit="img", disable=progress is None, leave=False)
    try:
        for batch in _batches(images, batch_size):
            maps = contribution_maps(model, batch.to(device)).double().cpu().numpy()
            for one in maps:
                if np.isnan(one).any():
                    num_nan += 1
                    continue
                total_map = one.copy() if total_map is None else total_map + one
                num_used += 1
            bar.update(len(maps))
    finally:
        bar.close()
        for p, flag in zip(model.parameters(), requires_grad):
            p.requires_grad_(flag)
    if total_map is None:
        raise RuntimeError(f"no usable ERF map: all {num_nan} images gave NaN gradients")
    return ERFResult(total_map / num_used, num_used, num_nan)


def _batches(images: Iterable[Tensor], batch_size: int) -> Iterator[Tensor]:
    pending: list[Tensor] = []
    for image in images:
        pending.append(image)
        if len(pending) == batch_size:
            yield torch.stack(pending)
            pending = []
    if pending:
        yield torch.stack(pending)


def normalized_heatmap(erf_map: np.ndarray) -> np.ndarray:
    """``log10(erf_map + 1) / max``: the (S, S) map rescaled to [0, 1] for display/comparison."""
    if erf_map.ndim != 2:
        raise ValueError(f"erf_map must be 2-D (S, S), got shape {erf_map.shape}")
    if not np.isfinite(erf_map).all() or (erf_map < 0).any():
        raise ValueError("erf_map must be finite and non-negative")
    scaled = np.log10(erf_map + 1.0)
    peak = scaled.max()
    return scaled / peak if peak > 0 else scaled


def high_contribution_area(heatmap: np.ndarray, threshold: float) -> tuple[int, float]:
    """Smallest centred square holding at least ``threshold`` of ``heatmap``'s total.

    Args:
        heatmap: (H, W) non-negative map (normally ``normalized_heatmap``'s output).
        threshold: fraction t in (0, 1].
    Returns:
        (side, area_ratio): the square's side in pixels (2r + 1 around (H // 2, W // 2), clipped
        to the image) and its area as a fraction of H * W.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    height, width = heatmap.shape
    total = heatmap.sum()
    if total <= 0:
        raise ValueError("heatmap has no mass")
    # Integral image: mass of any rectangle in O(1).
    integral = np.zeros((height + 1, width + 1))
    integral[1:, 1:] = heatmap.cumsum(0).cumsum(1)
    cy, cx = height // 2, width // 2
    for radius in range(max(height, width)):
        top, bottom = max(cy - radius, 0), min(cy + radius + 1, height)
        left, right = max(cx - radius, 0), min(cx + radius + 1, width)
        mass = integral[bottom, right] - integral[top, right] - integral[bottom, left] + integral[top, left]
        if mass >= threshold * total * (1 - 1e-12):
            return 2 * radius + 1, (bottom - top) * (right - left) / (height * width)
    return max(height, width), 1.0


def area_ratios(heatmap: np.ndarray, thresholds: Sequence[float] = ERF_THRESHOLDS) -> dict[float, float]:
    """{t: area ratio of the smallest centred square holding t of ``heatmap``} for each t."""
    return {t: high_contribution_area(heatmap, t)[1] for t in thresholds}


def axis_mass_fraction(erf_map: np.ndarray, half_width: int, exclude_radius: int = -1) -> float:
    """Fraction of ``erf_map``'s mass within ``half_width`` pixels of the centre row or column.

    A model whose scans run along rows and columns (VMamba's 1D routes) puts more of its ERF on
    this cross than one whose information spreads over 2D neighbourhoods.

    Args:
        erf_map: (H, W) non-negative map.
        half_width: the cross is the rows |i - H // 2| <= half_width and the columns likewise.
        exclude_radius: when >= 0, the centred square of side 2 * exclude_radius + 1 (the local
            peak every model has) is left out of both the cross and the total.
    """
    if half_width < 0:
        raise ValueError(f"half_width must be >= 0, got {half_width}")
    height, width = erf_map.shape
    dy = np.abs(np.arange(height) - height // 2)[:, None]
    dx = np.abs(np.arange(width) - width // 2)[None, :]
    kept = np.maximum(dy, dx) > exclude_radius
    cross = (dy <= half_width) | (dx <= half_width)
    total = erf_map[kept].sum()
    if total <= 0:
        raise ValueError("erf_map has no mass outside the excluded centre")
    return float(erf_map[kept & cross].sum() / total)


def log_heatmap(erf_map: np.ndarray, decades: float = 4.0) -> np.ndarray:
    """``log10(map / max)`` mapped from [-decades, 0] to [0, 1] (clipped): shows weak far-field
    structure that the linear-looking ``normalized_heatmap`` hides when the peak dominates."""
    if decades <= 0:
        raise ValueError(f"decades must be > 0, got {decades}")
    peak = erf_map.max()
    if not np.isfinite(erf_map).all() or (erf_map < 0).any() or peak <= 0:
        raise ValueError("erf_map must be finite, non-negative and not all zero")
    with np.errstate(divide="ignore"):
        scaled = np.log10(erf_map / peak)
    return np.clip(scaled / decades + 1.0, 0.0, 1.0)


def random_feature_maps(num_maps: int, channels: int, size: int, seed: int = 0) -> Iterator[Tensor]:
    """Yields ``num_maps`` seeded standard-normal (channels, size, size) maps: inputs for the ERF
    of a single mixer layer (e.g. one SS2D) rather than of a whole backbone."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(num_maps):
        yield torch.randn(channels, size, size, generator=generator)


def plot_erf_grid(
    heatmaps: Sequence[np.ndarray],
    titles: Sequence[str],
    path: str | Path,
    columns: Optional[int] = None,
    colorbar_label: str = "log10(ERF + 1) / max",
) -> Path:
    """Saves [0, 1] heatmaps as a titled grid (``columns`` per row, default one row) PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(heatmaps) != len(titles) or not heatmaps:
        raise ValueError("heatmaps and titles must be non-empty and of equal length")
    columns = columns or len(heatmaps)
    rows = math.ceil(len(heatmaps) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns + 0.8, 4.3 * rows), squeeze=False)
    image = None
    for index, axis in enumerate(axes.flat):
        axis.set_xticks([])
        axis.set_yticks([])
        if index >= len(heatmaps):
            axis.set_axis_off()
            continue
        image = axis.imshow(heatmaps[index], cmap="RdYlGn", vmin=0.0, vmax=1.0, interpolation="nearest")
        axis.set_title(titles[index], fontsize=10)
    figure.colorbar(image, ax=axes.ravel().tolist(), fraction=0.046 / columns, pad=0.02, label=colorbar_label)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def area_ratio_rows(results: dict[str, ERFResult], thresholds: Sequence[float] = ERF_THRESHOLDS) -> list[dict]:
    """One table row per model: model, images used, NaN maps skipped, area ratio per threshold."""
    rows = []
    for name, result in results.items():
        ratios = area_ratios(normalized_heatmap(result.mean_map), thresholds)
        row = {"model": name, "images": result.num_used, "nan_skipped": result.num_nan}
        row.update({f"t={t:g}": ratios[t] for t in thresholds})
        rows.append(row)
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    """Rows (dicts with the same keys) as a markdown table; floats with 4 decimals."""
    keys = list(rows[0])
    cell = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_tables(rows: Sequence[dict], folder: str | Path, stem: str = "area_ratios") -> tuple[Path, Path]:
    """Writes ``rows`` as ``<stem>.csv`` and ``<stem>.md`` in ``folder``; returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = folder / f"{stem}.csv", folder / f"{stem}.md"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    md_path.write_text(markdown_table(rows))
    return csv_path, md_path
