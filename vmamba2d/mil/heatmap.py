"""Attention heatmaps of a MIL model on a slide's grid, alone or over a slide thumbnail.

    attention, tissue = slide_attention(model, record)         # (H, W) float, (H, W) bool
    image = grid_heatmap(attention, tissue, cell_px=8)         # PIL RGB, one cell = cell_px pixels
    image = with_colour_bar(image, scale="rank", cmap="jet", title="slide S1: class 1 (p = 0.93)")
    image = thumbnail_overlay(attention, tissue, thumbnail, origin_px=record.origin_px,
                              step_px=record.step_px, downsample=64)

Colours: the tissue cells' attention is normalised (``scale="rank"``: percentile rank among the
tissue cells, as CLAM draws heatmaps, robust to one dominant cell; ``"max"``: divided by the
maximum) and mapped through a matplotlib colormap; non-tissue cells are transparent.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np
import torch
from PIL import Image

from .data.dataset import SlideRecord

SCALES = ("rank", "max")
SCALE_LABELS = {"rank": "attention: percentile rank among the tissue patches",
                "max": "attention / the slide's largest"}
READABLE_PX = 512  # a grid view's longer side at least this many pixels (readable_cell_px)
BAR_MARGIN_PX = 120  # room right of the heatmap for the colour bar and its labels


def tissue_mask(coords: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(n, 2) grid coords (x, y) -> (H, W) bool map of the occupied cells."""
    mask = torch.zeros(grid, dtype=torch.bool)
    mask[coords[:, 1].cpu(), coords[:, 0].cpu()] = True
    return mask


@torch.no_grad()
def slide_attention(model: torch.nn.Module, record: SlideRecord) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Run ``model`` (eval mode) on one slide record.

    Returns (attention (H, W) float32 CPU, tissue (H, W) bool, outputs dict of the model on CPU).
    """
    if not getattr(model, "has_attention", True):
        raise ValueError(f"model {getattr(model, 'model_name', type(model).__name__)} has no per-instance "
                         "attention score to draw (models with one: mambamil2d, mambamil, mambamil_sr, abmil, "
                         "clam_sb, dsmil)")
    model.eval()
    device = next(model.parameters()).device
    outputs = model(record.features.to(device), record.coords.to(device), grid_size=record.grid)
    outputs = {k: v.detach().float().cpu() for k, v in outputs.items()}
    return outputs["attention"], tissue_mask(record.coords, record.grid), outputs


def normalise_attention(attention: torch.Tensor, tissue: torch.Tensor, scale: str = "rank") -> np.ndarray:
    """(H, W) attention -> (H, W) values in [0, 1] on tissue cells (NaN elsewhere)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if attention.shape != tissue.shape:
        raise ValueError(f"attention {tuple(attention.shape)} and tissue {tuple(tissue.shape)} must have one (H, W) shape")
    if not bool(tissue.any()):
        raise ValueError("tissue mask is empty: nothing to draw")
    values = attention.double().numpy()
    mask = tissue.numpy()
    out = np.full(values.shape, np.nan)
    kept = values[mask]
    if scale == "rank":
        order = np.argsort(np.argsort(kept, kind="stable"), kind="stable")
        out[mask] = order / max(1, kept.size - 1)
    else:
        top = kept.max()
        out[mask] = kept / top if top > 0 else 0.0
    return out


def _rgba_cells(attention: torch.Tensor, tissue: torch.Tensor, scale: str, cmap: str, alpha: float) -> np.ndarray:
    """(H, W, 4) uint8 colours of the cells; non-tissue cells fully transparent."""
    from matplotlib import colormaps

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    values = normalise_attention(attention, tissue, scale)
    colours = colormaps[cmap](np.nan_to_num(values))
    colours[..., 3] = np.where(np.isnan(values), 0.0, alpha)
    return (colours * 255).round().astype(np.uint8)


def grid_heatmap(attention: torch.Tensor, tissue: torch.Tensor, *, cell_px: int = 8, scale: str = "rank",
                 cmap: str = "jet", background: Optional[tuple[int, int, int]] = (255, 255, 255)) -> Image.Image:
    """The attention map drawn on its grid: (H, W) -> PIL image of (W * cell_px, H * cell_px) pixels.

    ``background`` fills the non-tissue cells (None keeps them transparent, RGBA output).
    """
    if cell_px < 1:
        raise ValueError(f"cell_px must be >= 1, got {cell_px}")
    cells = Image.fromarray(_rgba_cells(attention, tissue, scale, cmap, 1.0))
    image = cells.resize((cells.width * cell_px, cells.height * cell_px), Image.NEAREST)
    if background is None:
        return image
    canvas = Image.new("RGBA", image.size, (*background, 255))
    return Image.alpha_composite(canvas, image).convert("RGB")


def thumbnail_overlay(attention: torch.Tensor, tissue: torch.Tensor, thumbnail: Image.Image, *,
                      origin_px: tuple[int, int], step_px: tuple[int, int],
                      downsample: Union[float, tuple[float, float]], alpha: float = 0.5, scale: str = "rank",
                      cmap: str = "jet") -> Image.Image:
    """The attention map blended over a slide thumbnail.

    Cell (col, row) covers level-0 pixels ``origin_px + (col, row) * step_px`` to the next cell;
    ``downsample`` = level-0 pixels per thumbnail pixel (a float or (x, y)). Returns an RGB image of
    the thumbnail's size; cells outside the thumbnail are clipped.
    """
    ds_x, ds_y = (downsample, downsample) if isinstance(downsample, (int, float)) else downsample
    if ds_x <= 0 or ds_y <= 0:
        raise ValueError(f"downsample must be positive, got {downsample!r}")
    cells = Image.fromarray(_rgba_cells(attention, tissue, scale, cmap, alpha))
    height, width = attention.shape
    size = (max(1, round(width * step_px[0] / ds_x)), max(1, round(height * step_px[1] / ds_y)))
    layer = Image.new("RGBA", thumbnail.size, (0, 0, 0, 0))
    layer.paste(cells.resize(size, Image.NEAREST), (round(origin_px[0] / ds_x), round(origin_px[1] / ds_y)))
    return Image.alpha_composite(thumbnail.convert("RGBA"), layer).convert("RGB")


def readable_cell_px(grid: tuple[int, int], minimum_px: int = READABLE_PX) -> int:
    """Pixels per cell that draw a (H, W) grid with its longer side at least ``minimum_px`` (and at
    least 4 pixels per cell)."""
    return max(4, -(-minimum_px // max(grid)))


def with_colour_bar(image: Image.Image, *, scale: str, cmap: str, title: str = "") -> Image.Image:
    """``image`` (a heatmap, pixels unchanged) with a labelled colour bar on its right and an
    optional title above: an RGB image of (W + BAR_MARGIN_PX, H + margins) pixels."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    width, height = image.size
    pad, top = 10, (30 if title else 10)
    bar_height = max(height, 160)
    fig_w, fig_h = width + BAR_MARGIN_PX + 2 * pad, max(height, bar_height) + top + pad
    dpi = 100
    fig = Figure(figsize=(fig_w / dpi, fig_h / dpi), dpi=dpi, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    fig.figimage(np.asarray(image.convert("RGB")), xo=pad, yo=pad, origin="upper")
    bar = fig.add_axes(((pad + width + 12) / fig_w, pad / fig_h, 14 / fig_w, bar_height / fig_h))
    colour_bar = fig.colorbar(ScalarMappable(norm=Normalize(0.0, 1.0), cmap=colormaps[cmap]), cax=bar)
    colour_bar.set_label(SCALE_LABELS[scale], fontsize=8)
    colour_bar.ax.tick_params(labelsize=8)
    if title:
        fig.text(pad / fig_w, 1 - 8 / fig_h, title, ha="left", va="top", fontsize=9)
    canvas.draw()
    return Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB")
