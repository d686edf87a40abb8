"""Attention heatmaps (vmamba2d.mil.heatmap) and vmamba2d-mil-heatmap (vmamba2d.cli.mil_heatmap)."""

import h5py
import numpy as np
import pytest
import torch
from matplotlib import colormaps
from PIL import Image

from vmamba2d.cli import mil_heatmap
from vmamba2d.mil import MambaMIL2D
from vmamba2d.mil.heatmap import (BAR_MARGIN_PX, grid_heatmap, normalise_attention, readable_cell_px,
                                  thumbnail_overlay, with_colour_bar)



def _map():
    attention = torch.tensor([[0.1, 0.0, 0.5], [0.3, 0.1, 0.0]])
    tissue = torch.tensor([[True, False, True], [True, True, False]])
    return attention, tissue


def test_normalise_attention():
    attention, tissue = _map()
    rank = normalise_attention(attention, tissue, "rank")
    # tissue values 0.1, 0.5, 0.3, 0.1 -> ranks (stable) 0, 3, 2, 1 of 3
    np.testing.assert_allclose(rank[tissue.numpy()], [0, 1, 2 / 3, 1 / 3])
    assert np.isnan(rank[~tissue.numpy()]).all()
    np.testing.assert_allclose(normalise_attention(attention, tissue, "max")[tissue.numpy()], [0.2, 1.0, 0.6, 0.2])
    with pytest.raises(ValueError, match="tissue mask is empty"):
        normalise_attention(attention, torch.zeros_like(tissue), "rank")


def test_grid_heatmap_pixels():
    attention, tissue = _map()
    image = grid_heatmap(attention, tissue, cell_px=4, scale="max", cmap="viridis")
    assert image.size == (12, 8)
    pixels = np.asarray(image)
    top = (np.array(colormaps["viridis"](1.0)[:3]) * 255).round()
    np.testing.assert_array_equal(pixels[0:4, 8:12].reshape(-1, 3), np.tile(top, (16, 1)))  # cell (row 0, col 2)
    assert (pixels[0:4, 4:8] == 255).all()  # non-tissue cell: background


def test_thumbnail_overlay_places_cells():
    attention, tissue = _map()
    thumbnail = Image.new("RGB", (40, 30), (0, 0, 0))
    # cells of 512 px at level 0, thumbnail at 1/64: 8 px per cell, grid origin at (128, 64) px -> (2, 1)
    image = np.asarray(thumbnail_overlay(attention, tissue, thumbnail, origin_px=(128, 64), step_px=(512, 512),
                                         downsample=64, alpha=1.0, scale="max", cmap="viridis"))
    top = (np.array(colormaps["viridis"](1.0)[:3]) * 255).round()
    np.testing.assert_array_equal(image[1 + 4, 2 + 16 + 4], top)  # centre of cell (row 0, col 2)
    assert (image[1 + 4, 2 + 8 + 4] == 0).all()  # non-tissue cell leaves the thumbnail unchanged
    assert (image[25:, :] == 0).all() and (image[:, 30:] == 0).all()


def test_cli_grid_and_thumbnail(tmp_path, capsys):
    torch.manual_seed(0)
    model = MambaMIL2D(in_dim=6, num_classes=3, dim=8, d_state=2)
    torch.save({"model": model.state_dict(), "model_config": model.config,
                "grid_options": {"duplicates": "mean", "max_cells": 100}}, tmp_path / "ckpt.pt")
    cells = np.array([(c, r) for r in range(4) for c in range(5) if (r + c) % 4])
    with h5py.File(tmp_path / "S1.h5", "w") as handle:
        handle["features"] = np.random.default_rng(0).standard_normal((len(cells), 6)).astype(np.float32)
        handle["coords"] = cells * 256 + 512
        handle["coords"].attrs.update(patch_size=128, patch_level=1, downsample=np.array([2.0, 2.0]),
                                      level_dim=np.array([1024, 768]))
    mil_heatmap.main(["--checkpoint", str(tmp_path / "ckpt.pt"), "--slide", str(tmp_path / "S1.h5"),
                      "--out", str(tmp_path / "grid.png"), "--cell-px", "3", "--save-array", str(tmp_path / "a.npy"),
                      "--no-colour-bar"])
    assert Image.open(tmp_path / "grid.png").size == (15, 12)
    # by default: readable (a 4 x 5 grid at >= 512 px wide) and with the colour bar beside it
    mil_heatmap.main(["--checkpoint", str(tmp_path / "ckpt.pt"), "--slide", str(tmp_path / "S1.h5"),
                      "--out", str(tmp_path / "readable.png")])
    width, height = Image.open(tmp_path / "readable.png").size
    assert width >= readable_cell_px((4, 5)) * 5 + BAR_MARGIN_PX and height >= readable_cell_px((4, 5)) * 4
    options = mil_heatmap.grid_options(mil_heatmap.parse_args(
        ["--checkpoint", str(tmp_path / "ckpt.pt"), "--slide", "x", "--out", "y", "--max-cells", "9"]))
    assert (options.duplicates, options.max_cells, options.placement) == ("mean", 9, "crop")
    torch.save({"model": model.state_dict(), "model_config": model.config,
                "config": {"grid": {"patch_step": [256, 256], "cap": "crop"}}}, tmp_path / "train.pth")
    options = mil_heatmap.grid_options(mil_heatmap.parse_args(
        ["--checkpoint", str(tmp_path / "train.pth"), "--slide", "x", "--out", "y"]))
    assert (options.patch_step, options.cap) == ((256, 256), "crop")
    assert np.load(tmp_path / "a.npy").shape == (4, 5)
    assert "S1: grid 4x5" in capsys.readouterr().out
    Image.new("RGB", (128, 96), (10, 10, 10)).save(tmp_path / "thumb.png")
    args = ["--checkpoint", str(tmp_path / "ckpt.pt"), "--slide", str(tmp_path / "S1.h5"), "--out",
            str(tmp_path / "over.png"), "--thumbnail", str(tmp_path / "thumb.png"), "--no-colour-bar"]
    mil_heatmap.main(args)  # scale from level_dim 1024 * 2 / 128 = 16 level-0 px per thumbnail px
    over = np.asarray(Image.open(tmp_path / "over.png"))
    assert over.shape == (96, 128, 3)
    assert (over[:32, :] == 10).all() and (over[:, :32] == 10).all()  # left of / above the tissue origin (512 px)
    assert (over[32:36, 48:52] != 10).any()  # cell (col 1, row 0) is drawn


def test_readable_cell_px_reaches_the_readable_size():
    assert readable_cell_px((14, 16)) * 16 >= 512 and readable_cell_px((14, 16)) * 15 < 512
    assert readable_cell_px((400, 300)) == 4  # large grids keep 4 px per cell


def test_colour_bar_keeps_the_heatmap_and_runs_from_low_to_high():
    from matplotlib import colormaps

    attention = torch.arange(12.0).reshape(3, 4)
    tissue = torch.ones(3, 4, dtype=torch.bool)
    heatmap = grid_heatmap(attention, tissue, cell_px=40, scale="max", cmap="viridis")
    framed = with_colour_bar(heatmap, scale="max", cmap="viridis", title="S1")
    pixels, original = np.asarray(framed).astype(int), np.asarray(heatmap).astype(int)
    width, height = heatmap.size
    top = framed.size[1] - 10 - height
    assert framed.size[0] == width + BAR_MARGIN_PX + 20
    assert (pixels[top:top + height, 10:10 + width] == original).all()  # drawn pixel for pixel
    # the bar's centre column, just inside its top and bottom ends: the colormap's ends
    column = pixels[:, 10 + width + 12 + 7]
    coloured = np.flatnonzero(np.abs(column - 255).sum(1) > 30)
    high, low = column[coloured[2]], column[coloured[-3]]
    viridis = colormaps["viridis"]
    assert np.abs(high - np.array(viridis(1.0)[:3]) * 255).max() < 25
    assert np.abs(low - np.array(viridis(0.0)[:3]) * 255).max() < 25
