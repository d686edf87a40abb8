"""Properties of the synthetic "stacked vs. scattered runs" slides (docs/mil.md, synthetic task)."""
from __future__ import annotations

import csv
from collections import Counter

import numpy as np
import pytest
import yaml

from vmamba2d.mil.synthetic import (NEGATIVE_KINDS, POSITIVE_KIND, ellipse_tissue,
                                    horizontal_runs, make_synthetic_slides, slide_grid,
                                    tumour_prototypes, write_synthetic_dataset)
from support.script_loading import load_benchmark

PATCH = 512


@pytest.fixture(scope="module")
def slides():
    return make_synthetic_slides(60, min_size=16, max_size=40, in_dim=32, seed=3)


def tumour_mask_from_features(slide, p0, p1):
    d0 = ((slide.features - p0) ** 2).sum(1)
    d1 = ((slide.features - p1) ** 2).sum(1)
    return d1 < d0


def test_labels_alternate_and_negative_kinds_are_balanced(slides):
    assert [s.label for s in slides] == [1, 0] * 30
    kinds = Counter(s.kind for s in slides)
    assert kinds == {POSITIVE_KIND: 30, NEGATIVE_KINDS[0]: 15, NEGATIVE_KINDS[1]: 15}


def test_grid_sizes_and_coordinates(slides):
    for s in slides:
        assert 16 <= s.height <= 40 and 16 <= s.width <= 40
        assert s.coords.dtype == np.int64 and s.features.dtype == np.float32
        assert s.features.shape == (len(s.coords), 32)
        assert (s.coords % PATCH == 0).all()
        cells = s.coords // PATCH
        assert len({tuple(c) for c in cells.tolist()}) == len(cells)  # distinct cells
        assert cells[:, 0].max() < s.width and cells[:, 1].max() < s.height
        # tissue = the ellipse: between 85 % and 100 % of the box's axes, so most of pi/4 * H * W
        assert 0.85**2 * np.pi / 4 * 0.8 < len(cells) / (s.height * s.width) <= 1.0
    raster = [np.array_equal(np.lexsort((s.coords[:, 0], s.coords[:, 1])), np.arange(len(s.coords)))
              for s in slides]
    assert not any(raster)  # rows are shuffled


def test_token_multiset_is_the_same_in_both_classes(slides):
    p0, p1 = tumour_prototypes(32, seed=0)  # make_synthetic_slides default prototype_seed
    for s in slides:
        tumour = tumour_mask_from_features(s, p0, p1)
        assert tumour.sum() == 9
        cells = (s.coords[tumour] // PATCH)[:, ::-1]  # (row, col)
        assert sorted(map(tuple, cells.tolist())) == sorted(map(tuple, s.tumour_cells.tolist()))


def test_horizontal_runs_are_three_runs_of_three_on_three_rows(slides):
    for s in slides:
        assert horizontal_runs(s.tumour_cells) == [3, 3, 3]
        assert len(set(s.tumour_cells[:, 0].tolist())) == 3


def test_motifs(slides):
    for s in slides:
        starts = sorted({(r, min(c for rr, c in s.tumour_cells.tolist() if rr == r))
                         for r in s.tumour_cells[:, 0].tolist()})
        rows = [r for r, _ in starts]
        cols = [c for _, c in starts]
        steps = np.diff(cols)
        if s.kind == POSITIVE_KIND:
            assert np.diff(rows).tolist() == [1, 1] and steps.tolist() == [0, 0]
        elif s.kind == "row_gap":
            assert np.diff(rows).tolist() == [2, 2] and steps.tolist() == [0, 0]
        else:
            assert np.diff(rows).tolist() == [1, 1]
            assert all(4 <= abs(d) <= 6 for d in steps) and steps[0] * steps[1] > 0


def test_motif_lies_inside_the_tissue(slides):
    for s in slides:
        grid = slide_grid(s, PATCH)
        assert (grid[s.tumour_cells[:, 0], s.tumour_cells[:, 1]] == 1).all()
        assert (grid == 1).sum() == 9


def test_layout_does_not_depend_on_the_label():
    first_positive = make_synthetic_slides(12, min_size=16, max_size=24, seed=5, first_label=1)
    first_negative = make_synthetic_slides(12, min_size=16, max_size=24, seed=5, first_label=0)
    for a, b in zip(first_positive, first_negative):
        assert a.label != b.label
        assert (a.height, a.width) == (b.height, b.width)
        assert sorted(map(tuple, a.coords.tolist())) == sorted(map(tuple, b.coords.tolist()))


def test_ellipse_fills_the_box():
    full = ellipse_tissue(20, 30, 1.0)
    assert full[10].all() and full[:, 15].all()  # the axes span the whole box
    assert not full[0, 0] and not full[-1, -1]


def test_too_small_grids_are_refused():
    with pytest.raises(ValueError, match="too small"):
        make_synthetic_slides(2, min_size=4, max_size=6)


def test_written_dataset(tmp_path):
    h5py = pytest.importorskip("h5py")
    labels = write_synthetic_dataset(tmp_path, {"train": 4, "test": 2}, min_size=12, max_size=16,
                                     in_dim=8, seed=1)
    with open(labels) as handle:
        rows = list(csv.DictReader(handle))
    assert [r["split"] for r in rows] == ["train"] * 4 + ["test"] * 2
    assert [r["label"] for r in rows] == ["positive", "negative"] * 3
    with h5py.File(tmp_path / "features" / f"{rows[0]['slide_id']}.h5") as handle:
        assert handle["features"].shape[1] == 8 and handle["coords"].shape[1] == 2
        assert handle["coords"].attrs["patch_size"] == PATCH


def test_shuffled_cells_control_keeps_patches_and_cells_but_breaks_the_motif(slides):
    from vmamba2d.mil.synthetic import shuffle_cells

    broken = 0
    for index, s in enumerate(slides):
        control = shuffle_cells(s, seed=index)
        assert sorted(map(tuple, control.coords.tolist())) == sorted(map(tuple, s.coords.tolist()))
        np.testing.assert_array_equal(control.features, s.features)
        assert control.label == s.label and len(control.tumour_cells) == 9
        grid = slide_grid(control, PATCH)
        assert (grid[control.tumour_cells[:, 0], control.tumour_cells[:, 1]] == 1).all()
        broken += horizontal_runs(control.tumour_cells) != [3, 3, 3]
    assert broken >= 0.9 * len(slides)


def _load_benchmark():
    return load_benchmark("mil_synthetic")


def test_benchmark_tool_trains_every_row_and_writes_the_table(tmp_path):
    tool = _load_benchmark()
    out = tmp_path / "table.md"
    argv = ["--min-size", "12", "--max-size", "14", "--train", "6", "--val", "4", "--test", "4",
            "--epochs", "1", "--work", str(tmp_path / "work"), "--out", str(out)]
    assert tool.main(argv) == 0
    table = out.read_text()
    for label, _, _ in tool.MODELS.values():
        assert f"| {label} |" in table
    # the raster row really ran the 2D model's blocks on the flattened canvas
    config = (tmp_path / "work" / "raster" / "config.yaml").read_text()
    assert "scan: raster" in config


def test_benchmark_tool_names_grids_too_small_for_the_motifs(tmp_path, capsys):
    tool = _load_benchmark()
    assert tool.main(["--min-size", "8", "--max-size", "10", "--work", str(tmp_path)]) == 2
    assert "too small to hold the motifs" in capsys.readouterr().err


def test_benchmark_tool_reference_settings_reach_the_model_config(tmp_path):
    tool = _load_benchmark()
    argv = ["--min-size", "12", "--max-size", "14", "--train", "4", "--val", "2", "--test", "2",
            "--epochs", "1", "--models", "raster", "abmil", "mambamil_sr", "--reference-settings",
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "table.md")]
    assert tool.main(argv) == 0
    def model_kwargs(row):
        return yaml.safe_load((tmp_path / "work" / row / "config.yaml").read_text())["model_kwargs"]

    assert model_kwargs("raster") == dict(dim=32, d_state=8, expand=2, num_blocks=1, scan="raster",
                                          init="mamba", mask_pad=False)
    assert model_kwargs("abmil") == dict(dim=32, act="gelu", init="xavier")  # the variant measured
    assert model_kwargs("mambamil_sr") == dict(dim=32, d_state=8, expand=2, num_blocks=1, init="mamba")
