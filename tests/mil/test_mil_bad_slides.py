"""Unusable slide files in a MIL run (mil/train.py, mil/eval.py through their main functions): every
bad slide of every split is reported at once, exit code 2 and nothing written; with
--skip-bad-slides the run trains without them and says which."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from vmamba2d.mil.cli import eval_main, train_main
from vmamba2d.mil.survival import survival_bin_edges
from vmamba2d.mil.synthetic import LABEL_NAMES, make_synthetic_slides, write_slide_file

IN_DIM = 8


class NotATensor:
    """A pickled Python object: torch.load(weights_only=True) refuses it."""


pytestmark = pytest.mark.usefixtures("one_thread_module")  # one intra-op thread: reproducible, and fast on 2 cores


def _h5(path: Path, features, coords) -> None:
    with h5py.File(path, "w") as handle:
        handle["features"] = features
        handle["coords"] = coords


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# slide -> how its file is broken, and the words the report must use for it
def truncated_h5(slide, folder):
    _truncate(write_slide_file(slide, folder, "h5"))


def zero_byte_h5(slide, folder):
    (folder / f"{slide.slide_id}.h5").write_bytes(b"")


def short_coords_h5(slide, folder):
    _h5(folder / f"{slide.slide_id}.h5", slide.features, slide.coords[:-1])


def short_coords_pt(slide, folder):
    torch.save({"features": torch.from_numpy(slide.features),
                "coords": torch.from_numpy(slide.coords[:-1])}, folder / f"{slide.slide_id}.pt")


def nan_features(slide, folder):
    features = slide.features.copy()
    features[1, 2] = np.nan
    _h5(folder / f"{slide.slide_id}.h5", features, slide.coords)


def inf_features(slide, folder):
    features = slide.features.copy()
    features[0, 0] = np.inf
    _h5(folder / f"{slide.slide_id}.h5", features, slide.coords)


def duplicate_coords(slide, folder):
    coords = slide.coords.copy()
    coords[1] = coords[0]
    _h5(folder / f"{slide.slide_id}.h5", slide.features, coords)


def negative_coords(slide, folder):
    coords = slide.coords.copy()
    coords[0] = (-512, 0)
    _h5(folder / f"{slide.slide_id}.h5", slide.features, coords)


def far_coords(slide, folder):
    coords = slide.coords.copy()
    coords[0] = (2**40, 2**40)  # a grid of ~2^64 cells: its cell index overflows int64
    _h5(folder / f"{slide.slide_id}.h5", slide.features, coords)


def empty_slide(slide, folder):
    _h5(folder / f"{slide.slide_id}.h5", np.zeros((0, IN_DIM), np.float32),
        np.zeros((0, 2), np.int64))


def wrong_feature_size(slide, folder):
    _h5(folder / f"{slide.slide_id}.h5", slide.features[:, :4], slide.coords)


def one_d_features(slide, folder):
    _h5(folder / f"{slide.slide_id}.h5", slide.features[:, 0], slide.coords)


def truncated_pt(slide, folder):
    _truncate(write_slide_file(slide, folder, "pt"))


def refused_pickle_pt(slide, folder):
    torch.save({"features": torch.from_numpy(slide.features),
                "coords": torch.from_numpy(slide.coords), "meta": NotATensor()},
               folder / f"{slide.slide_id}.pt")


BREAKAGES = [  # (split, index in that split, breakage, words of the report)
    ("train", 0, truncated_h5, "cannot read HDF5 file"),
    ("train", 1, zero_byte_h5, "cannot read HDF5 file"),
    ("train", 2, short_coords_h5, "feature rows but"),
    ("train", 3, short_coords_pt, "feature rows but"),
    ("train", 4, nan_features, "NaN or infinite"),
    ("train", 5, inf_features, "NaN or infinite"),
    ("train", 6, duplicate_coords, "more than one patch"),
    ("train", 7, negative_coords, "negative pixel positions"),
    ("val", 0, empty_slide, "empty slide"),
    ("val", 1, wrong_feature_size, "features have F=4, expected in_dim=8"),
    ("val", 2, far_coords, "grid limit"),
    ("test", 0, one_d_features, "features must be 2-D"),
    ("test", 1, truncated_pt, "truncated or not a torch file"),
    ("test", 2, refused_pickle_pt, "not loaded for safety"),
]
SPLIT_SIZES = {"train": 16, "val": 6, "test": 6}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """Good slides in ``good/``; the same slides with 14 broken files in ``bad/``."""
    root = tmp_path_factory.mktemp("mil_bad")
    good, bad = root / "good", root / "bad"
    good.mkdir()
    rows, slides = [], {}
    for seed, (split, count) in enumerate(SPLIT_SIZES.items()):
        slides[split] = make_synthetic_slides(count, min_size=8, max_size=12, in_dim=IN_DIM,
                                              seed=seed, prefix=split)
        for slide in slides[split]:
            write_slide_file(slide, good, "h5")
            rows.append((slide.slide_id, LABEL_NAMES[slide.label], split))
    with open(root / "labels.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([("slide_id", "label", "split"), *rows])
    shutil.copytree(good, bad)
    broken = []
    for split, index, breakage, words in BREAKAGES:
        slide = slides[split][index]
        (bad / f"{slide.slide_id}.h5").unlink()
        breakage(slide, bad)
        file = next(bad.glob(f"{slide.slide_id}.*"))
        broken.append((slide.slide_id, split, file, words))
    return {"root": root, "good": good, "bad": bad, "broken": broken, "slides": slides}


def train_args(data: dict, features: Path, output: Path, *extra: str) -> list[str]:
    return ["--feature-dir", str(features), "--label-csv", str(data["root"] / "labels.csv"),
            "--label-map", "negative=0", "positive=1", "--output", str(output), "--epochs", "1",
            "--lr", "3e-3", "--device", "cpu", "--no-progress", "--seeds", "1",
            "--model-kwargs", "dim=16", "d_state=4", *extra]


def test_every_bad_slide_is_reported_at_once_and_nothing_is_written(data, tmp_path, capsys):
    output = tmp_path / "run"
    assert train_main(train_args(data, data["bad"], output)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"14 of {sum(SPLIT_SIZES.values())} slide(s) are unusable" in err
    assert "--skip-bad-slides" in err
    lines = err.splitlines()
    for slide_id, split, file, words in data["broken"]:
        line = next((x for x in lines if x.strip().startswith(f"{slide_id} ({split}) {file}:")),
                    None)
        assert line is not None, f"{slide_id} not reported"
        assert words in line, (words, line)
    assert not output.exists()


def test_skip_bad_slides_trains_without_them_and_counts_them(data, tmp_path, capsys):
    output = tmp_path / "run"
    assert train_main(train_args(data, data["bad"], output, "--skip-bad-slides")) == 0
    broken = sorted(slide_id for slide_id, *_ in data["broken"])
    total = json.loads((output / "summary.json").read_text())
    assert total["skipped_bad_slides"]["count"] == 14
    assert sorted(s["slide_id"] for s in total["skipped_bad_slides"]["slides"]) == broken
    run = json.loads((output / "seed1" / "summary.json").read_text())
    assert run["skipped_bad_slides"] == {"count": 14, "slide_ids": broken}
    assert (run["train_slides"], run["val_slides"], run["test_slides"]) == (8, 3, 3)
    with open(output / "seed1" / "predictions_test.csv") as handle:
        predicted = {row["slide_id"] for row in csv.DictReader(handle)}
    assert predicted == {s.slide_id for s in data["slides"]["test"][3:]}
    # the same run continues (its skipped slides are unchanged) ...
    assert train_main(train_args(data, data["bad"], output, "--skip-bad-slides", "--resume")) == 0
    # ... and its checkpoint evaluates on the test split without the skipped slides
    capsys.readouterr()
    assert eval_main(["--checkpoint", str(output / "seed1" / "best.pth"), "--device", "cpu",
                      "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 3


def test_resume_refuses_when_the_unusable_slides_changed(data, tmp_path, capsys):
    features = tmp_path / "features"
    shutil.copytree(data["bad"], features)
    output = tmp_path / "run"
    assert train_main(train_args(data, features, output, "--skip-bad-slides")) == 0
    fixed_id, split, file, _ = data["broken"][0]  # the user repairs one file
    (features / file.name).unlink()
    write_slide_file(data["slides"][split][0], features, "h5")
    capsys.readouterr()
    assert train_main(train_args(data, features, output, "--skip-bad-slides", "--resume")) == 2
    err = capsys.readouterr().err
    assert "continuing would change its training data" in err and fixed_id in err


def test_eval_reports_bad_slides_and_can_skip_them(data, tmp_path, capsys):
    output = tmp_path / "run"
    assert train_main(train_args(data, data["good"], output)) == 0
    checkpoint = str(output / "seed1" / "best.pth")
    capsys.readouterr()
    args = ["--checkpoint", checkpoint, "--feature-dir", str(data["bad"]), "--device", "cpu",
            "--no-progress"]
    assert eval_main(args) == 2
    err = capsys.readouterr().err
    bad_test = [(i, f) for i, s, f, _ in data["broken"] if s == "test"]
    assert "3 of 6 slide(s) are unusable" in err and "Traceback" not in err
    assert all(f"{i} (test) {f}:" in err for i, f in bad_test)
    assert eval_main(args + ["--skip-bad-slides"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n"] == 3
    assert got["skipped_bad_slides"] == {"count": 3, "slide_ids": sorted(i for i, _ in bad_test)}


def test_survival_bins_come_from_the_usable_training_patients(data, tmp_path):
    """A patient whose slide is unusable is left out before the time bins are computed."""
    slides = [s.slide_id for s in data["slides"]["train"]][6:16]  # 6 and 7 are broken
    rng = np.random.default_rng(1)
    times = np.round(rng.uniform(1, 100, len(slides)), 2)
    censorship = (np.arange(len(slides)) % 3 == 1).astype(int)
    root = data["root"]
    with open(root / "surv.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("", "case_id", "slide_id", "censorship", "survival_months"))
        writer.writerows((i, f"case{i:02d}", s, c, t)
                         for i, (s, t, c) in enumerate(zip(slides, times, censorship)))
    with open(root / "surv_splits_0.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("", "train", "val", "test"))
        writer.writerows((i, f"case{i:02d}", f"case{i + 6:02d}" if i < 4 else "", "")
                         for i in range(6))
    output = tmp_path / "surv"
    assert train_main(["--task", "survival", "--feature-dir", str(data["bad"]),
                       "--label-csv", str(root / "surv.csv"),
                       "--split-csv", str(root / "surv_splits_{fold}.csv"), "--folds", "0",
                       "--output", str(output), "--epochs", "1", "--device", "cpu",
                       "--no-progress", "--model-kwargs", "dim=16", "d_state=4",
                       "--skip-bad-slides"]) == 0
    best = torch.load(output / "fold0-seed0" / "best.pth", weights_only=True)
    usable = [2, 3, 4, 5]  # training patients case02..case05: their slides are intact
    expected = survival_bin_edges(times[usable].tolist(), censorship[usable].tolist(), 4)
    np.testing.assert_allclose(best["bin_edges"], expected)
    summary = json.loads((output / "fold0-seed0" / "summary.json").read_text())
    assert summary["train_slides"] == 4 and summary["skipped_bad_slides"]["count"] == 2
