"""Slides to predictions on generated slides: vmamba2d.mil.extract (CLAM-format .h5, features equal
to the encoder on tiles read directly, bad slides reported, resume with verification, a killed
run), then mil/train.py on the extracted features and vmamba2d.mil.predict on slides and .h5 with
heatmaps; the encoder presets and weight files."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("openslide")
pytest.importorskip("tiffslide")
h5py = pytest.importorskip("h5py")

from vmamba2d.mil.encoders import build_encoder  # noqa: E402
from vmamba2d.mil.extract import main as extract_main  # noqa: E402
from vmamba2d.mil.extract import verify_features  # noqa: E402
from vmamba2d.mil.slides.synthetic import Blob, synthetic_slide_pixels, write_pyramid  # noqa: E402

EXTRACT = ["--encoder", "resnet18_trunc", "--random-init", "--patch-size", "32", "--mpp", "2", "--input-size", "32",
           "--workers", "0", "--batch-size", "16", "--device", "cpu", "--no-progress", "--seg-downsample", "4",
           "--min-tissue-area", "0.005"]
SIZE = (768, 640)


def _blobs(index):
    rng = np.random.default_rng(index)
    return [Blob(float(rng.uniform(180, 560)), float(rng.uniform(180, 450)), float(rng.uniform(110, 170)),
                 float(rng.uniform(110, 170)))]


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    """8 tissue slides, one blank, one corrupt, one without a pixel size."""
    root = tmp_path_factory.mktemp("wsi")
    for index in range(8):
        write_pyramid(root / f"s{index}.tif", synthetic_slide_pixels(SIZE, _blobs(index), seed=index), mpp=0.5)
    write_pyramid(root / "blank.tif", synthetic_slide_pixels(SIZE, [], seed=20), mpp=0.5)
    (root / "corrupt.svs").write_bytes(b"II*\x00" + bytes(range(256)) * 4)
    write_pyramid(root / "nompp.tif", synthetic_slide_pixels(SIZE, _blobs(30), seed=30), mpp=None)
    return root


@pytest.fixture(scope="module")
def extracted(slides, tmp_path_factory):
    out = tmp_path_factory.mktemp("features")
    torch.set_num_threads(1)
    assert extract_main([str(slides), str(out), *EXTRACT]) == 1  # bad slides -> non-zero
    return out


@pytest.mark.slow
def test_bad_slides_are_reported_and_skipped(extracted, capsys):
    summary = json.loads((extracted / "extract_summary.json").read_text())
    assert sorted(summary["done"]) == [f"s{i}" for i in range(8)]
    failed = dict(summary["failed"])
    assert set(failed) == {"blank", "corrupt", "nompp"}
    assert "no tissue patch" in failed["blank"] and "cannot be read" in failed["corrupt"]
    assert "no pixel size" in failed["nompp"]
    assert sorted(p.name for p in (extracted / "h5_files").iterdir()) == [f"s{i}.h5" for i in range(8)]
    assert sorted(p.name for p in (extracted / "thumbnails").iterdir()) == [f"s{i}.png" for i in range(8)]


def test_h5_files_are_in_clams_format(extracted):
    settings = json.loads((extracted / "extract.json").read_text())
    assert settings["feature_dim"] == 256 and settings["patches"]["mpp"] == 2.0
    from vmamba2d.mil.data.grid import patch_step_from_attrs
    from vmamba2d.mil.data.slide_files import read_slide_file

    for index in range(8):
        path = extracted / "h5_files" / f"s{index}.h5"
        with h5py.File(path, "r") as handle:
            features, coords = handle["features"][()], handle["coords"][()]
            attrs = dict(handle["coords"].attrs)
        assert features.dtype == np.float32 and features.shape == (len(coords), 256) and len(coords) > 0
        assert coords.dtype == np.int64 and np.all(coords % 128 == 0)
        assert attrs["patch_level"] == 1 and attrs["patch_size"] == 32 and attrs["encoder"] == "resnet18_trunc"
        assert attrs["mpp"] == 2.0 and attrs["slide_mpp"] == 0.5
        raw = read_slide_file(path)  # the MIL data layer reads it as a CLAM file
        assert patch_step_from_attrs(raw.attrs) == (128, 128)
        assert verify_features(path, settings) is None


def test_features_equal_the_encoder_on_tiles_read_directly(slides, extracted):
    import openslide

    encoder = build_encoder("resnet18_trunc", random_init=True, seed=0)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with h5py.File(extracted / "h5_files" / "s3.h5", "r") as handle:
        features, coords = handle["features"][()], handle["coords"][()]
    slide = openslide.OpenSlide(str(slides / "s3.tif"))
    picks = [0, len(coords) // 2, len(coords) - 1]
    tiles = [np.asarray(slide.read_region(tuple(map(int, coords[i])), 1, (32, 32)).convert("RGB")) for i in picks]
    images = torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        expected = encoder.module((images - mean) / std)
    np.testing.assert_allclose(features[picks], expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_rerun_skips_verified_slides_and_redoes_the_others(slides, extracted, tmp_path):
    out = tmp_path / "copy"
    h5_dir = out / "h5_files"
    h5_dir.mkdir(parents=True)
    for name in ("s0.h5", "s1.h5", "s2.h5"):
        (h5_dir / name).write_bytes((extracted / "h5_files" / name).read_bytes())
    (h5_dir / "s1.h5").write_bytes((h5_dir / "s1.h5").read_bytes()[:600])  # truncated
    (h5_dir / ".s4.h5.partial").write_bytes(b"half")  # what a killed run leaves
    before = (h5_dir / "s0.h5").stat().st_mtime_ns
    subset = [str(slides / f"s{i}.tif") for i in range(5)]
    assert extract_main([*subset, str(out), *EXTRACT]) == 0
    summary = json.loads((out / "extract_summary.json").read_text())
    assert sorted(summary["skipped"]) == ["s0", "s2"] and sorted(summary["done"]) == ["s1", "s3", "s4"]
    assert (h5_dir / "s0.h5").stat().st_mtime_ns == before
    assert not list(h5_dir.glob(".*"))
    with h5py.File(h5_dir / "s1.h5", "r") as new, h5py.File(extracted / "h5_files" / "s1.h5", "r") as old:
        np.testing.assert_allclose(new["features"][()], old["features"][()], rtol=1e-5, atol=1e-6)
    # other settings: every file is redone
    assert extract_main([*subset, str(out), *EXTRACT[:-1], "0.004"]) == 0
    assert len(json.loads((out / "extract_summary.json").read_text())["done"]) == 5


@pytest.mark.slow
def test_a_killed_run_leaves_only_complete_files(slides, tmp_path):
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "vmamba2d.mil.extract", *[str(slides / f"s{i}.tif") for i in range(8)],
               str(out), *EXTRACT]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((out / "h5_files").glob("s*.h5")):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    settings = json.loads((out / "extract.json").read_text())
    finished = sorted((out / "h5_files").glob("*.h5"))
    assert finished and all(verify_features(path, settings) is None for path in finished)
    assert extract_main([str(slides / f"s{i}.tif") for i in range(8)] + [str(out), *EXTRACT]) == 0
    summary = json.loads((out / "extract_summary.json").read_text())
    assert len(summary["skipped"]) >= len(finished) and len(summary["skipped"]) + len(summary["done"]) == 8
    assert not list((out / "h5_files").glob(".*"))


def test_train_on_extracted_features_then_predict_with_heatmaps(slides, extracted, tmp_path, capsys):
    from vmamba2d.mil.cli import train_main
    from vmamba2d.mil.predict import main as predict_main

    labels = tmp_path / "labels.csv"
    splits = ["train"] * 4 + ["val"] * 2 + ["test"] * 2
    with open(labels, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("slide_id", "label", "split"))
        writer.writerows((f"s{i}", "tumour" if i % 2 else "normal", split) for i, split in enumerate(splits))
    run = tmp_path / "run"
    assert train_main(["--feature-dir", str(extracted / "h5_files"), "--label-csv", str(labels), "--output", str(run),
                       "--model", "abmil", "--model-kwargs", "dim=16", "attn_hidden=8", "--epochs", "1",
                       "--device", "cpu", "--no-progress", "--seeds", "0"]) == 0
    out = tmp_path / "pred"
    inputs = [str(slides / "s6.tif"), str(slides / "blank.tif"), str(extracted / "h5_files" / "s7.h5")]
    assert predict_main([str(run), *inputs, "--out", str(out), "--device", "cpu"]) == 1  # the blank slide
    printed = capsys.readouterr().out
    assert "failed: blank" in printed
    with open(out / "predictions.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["slide_id"] for r in rows] == ["s7", "s6"]
    for row in rows:
        probabilities = [float(row["p_normal"]), float(row["p_tumour"])]
        assert sum(probabilities) == pytest.approx(1, abs=1e-6)
        assert row["predicted"] == ("normal", "tumour")[int(np.argmax(probabilities))]
    # the slide extracted on the fly gives the features the training extraction wrote
    with h5py.File(out / "h5_files" / "s6.h5", "r") as new, h5py.File(extracted / "h5_files" / "s6.h5", "r") as old:
        np.testing.assert_allclose(new["features"][()], old["features"][()], rtol=1e-5, atol=1e-6)
    from PIL import Image

    over_slide = Image.open(out / "heatmaps" / "s6.png")
    assert over_slide.size == SIZE  # the thumbnail: level 0 of a slide under 1024 px
    assert Image.open(out / "heatmaps" / "s7.png").size[0] > 0


@pytest.mark.slow
def test_encoder_weights_from_files(tmp_path):
    from safetensors.torch import save_file

    reference = build_encoder("resnet18_trunc", random_init=True, seed=3)
    state = {k: v.contiguous() for k, v in reference.module.resnet.state_dict().items()}
    save_file(state, tmp_path / "r18.safetensors")
    torch.save({"state_dict": state}, tmp_path / "r18.pth")
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference.module(images)
    for name in ("r18.safetensors", "r18.pth"):
        loaded = build_encoder("resnet18_trunc", weights=tmp_path / name, seed=99)
        with torch.no_grad():
            torch.testing.assert_close(loaded.module(images), expected)
        assert loaded.dim == 256 and len(loaded.weights_sha256) == 64
    truncated = {k: v for k, v in state.items() if not k.startswith("layer4.")}  # stage 4 is not used
    save_file(truncated, tmp_path / "trunc.safetensors")
    assert build_encoder("resnet18_trunc", weights=tmp_path / "trunc.safetensors").dim == 256
    save_file({k: v for k, v in truncated.items() if not k.startswith("layer3.")}, tmp_path / "short.safetensors")
    with pytest.raises(ValueError, match=r"missing keys \(\d+\): layer3"):
        build_encoder("resnet18_trunc", weights=tmp_path / "short.safetensors")
    with pytest.raises(ValueError, match="does not fit"):
        build_encoder("resnet34_trunc", weights=tmp_path / "r18.safetensors")
    with pytest.raises(ValueError, match="--random-init"):
        build_encoder("resnet18_trunc")
    with pytest.raises(ValueError, match="not a timm model"):
        build_encoder("no_such_net", random_init=True)
    assert build_encoder("resnet50_trunc", random_init=True, input_size=32).dim == 1024  # CLAM's preset
    state = torch.random.get_rng_state()
    build_encoder("resnet18_trunc", random_init=True, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_extract_usage_errors(slides, tmp_path, capsys):
    with pytest.raises(SystemExit):  # --weights or --random-init is required
        extract_main([str(slides / "s0.tif"), str(tmp_path), "--encoder", "resnet18_trunc"])
    assert extract_main([str(tmp_path / "none"), str(tmp_path), *EXTRACT]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_prediction_rows():
    from vmamba2d.mil.predict import prediction_row

    row = prediction_row("a", {"probabilities": torch.tensor([[0.2, 0.5, 0.3]])}, {"label_map": {"x": 0, "y": 1, "z": 2}})
    assert row == {"slide_id": "a", "predicted": "y", "p_x": pytest.approx(0.2), "p_y": pytest.approx(0.5),
                   "p_z": pytest.approx(0.3)}
    hazards = torch.tensor([[0.1, 0.5]])
    survival = torch.cumprod(1 - hazards, dim=1)
    row = prediction_row("b", {"risk": -survival.sum(1), "survival": survival}, {"label_map": None})
    assert row == {"slide_id": "b", "risk": pytest.approx(-(0.9 + 0.45)), "survival_0": pytest.approx(0.9),
                   "survival_1": pytest.approx(0.45)}


def test_predict_usage_errors(tmp_path, capsys):
    from vmamba2d.mil.predict import main as predict_main

    assert predict_main([str(tmp_path / "no_run"), str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert predict_main([str(tmp_path / "run"), str(tmp_path)]) == 2
    assert "no best.pth" in capsys.readouterr().err
