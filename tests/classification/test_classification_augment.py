"""The recipe's augmentation with any Pillow, and transform failures named in one line.

Pillow 13 raises for ``ImageOps.posterize(image, 0)``, which timm's PosterizeIncreasing asks for
at the top of the magnitude range (about 1 image in 600 with the recipe's
``rand-m9-mstd0.5-inc1``); Pillow < 13 returned a black image there.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from vmamba2d.classification import train as train_cli
from vmamba2d.classification.auto_augment import POSTERIZE_OPS, augment_ops, posterize_keeping_bits
from vmamba2d.classification.config import resolve_train_config
from vmamba2d.classification.data import TransformSteps, make_image_folder, train_loader, train_transform
from vmamba2d.classification.errors import DataTransformError, UsageError
from support.tiny_imagefolder import make_tiny_imagefolder
from vmamba2d.runs.seeding import sample_seed_words, seeded_global_rngs

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread_module")  # one intra-op thread: reproducible, and fast on 2 cores


IMAGENET_CONFIG = {"input_size": (3, 32, 32), "interpolation": "bicubic",
                   "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
                   "crop_pct": 0.875}


def recipe_transform(auto_augment: str) -> TransformSteps:
    return train_transform(IMAGENET_CONFIG, auto_augment=auto_augment, color_jitter=0.4,
                           re_prob=0.25, re_mode="pixel", re_count=1)


def record_posterize_bits(transform: TransformSteps) -> list[int]:
    """Make every posterize op of ``transform`` append the bits it is asked for to the
    returned list (then call the op's function as before)."""
    asked: list[int] = []
    (step,) = [step for name, step in transform.steps if "--aa" in name]
    for op in augment_ops(step):
        if op.name in POSTERIZE_OPS:
            def recording(image, bits, _posterize=op.aug_fn, **kwargs):
                asked.append(bits)
                return _posterize(image, bits, **kwargs)
            op.aug_fn = recording
    return asked


def old_pillow_posterize(pixels: np.ndarray, bits: int) -> np.ndarray:
    """ImageOps.posterize of Pillow < 13 on uint8 values: ``value & ~(2 ** (8 - bits) - 1)``."""
    mask = ~(2 ** (8 - bits) - 1)
    return (pixels.astype(np.int64) & mask).astype(np.uint8)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_posterize_matches_pillow_before_13_down_to_zero_bits(mode):
    rng = np.random.default_rng(0)
    shape = (9, 7, 3) if mode == "RGB" else (9, 7)
    pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
    image = Image.fromarray(pixels, mode=mode)
    for bits in range(-1, 9):
        got = np.asarray(posterize_keeping_bits(image, bits, fillcolor=(1, 2, 3)))
        expected = pixels if bits >= 8 else old_pillow_posterize(pixels, bits)
        np.testing.assert_array_equal(got, expected, err_msg=f"bits {bits}")
    assert not np.asarray(posterize_keeping_bits(image, 0)).any()  # black


def test_recipe_augmentation_survives_the_top_of_the_magnitude_range():
    """3,000 draws seeded as the training loader seeds them (seed 0, epoch 0, index i): the
    posterize ops are asked for 0 bits several times, and every draw gives an image."""
    recipe = yaml.safe_load((REPO / "vmamba2d" / "configs" / "classification" / "vmamba2d_tiny.yaml")
                            .read_text())["aa"]
    transform = recipe_transform(recipe)
    asked = record_posterize_bits(transform)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), np.uint8))
    for index in range(3000):
        with seeded_global_rngs(sample_seed_words(0, 0, index)):
            out = transform(image)
        assert out.shape == (3, 32, 32) and torch.isfinite(out).all()
    assert asked.count(0) >= 3, sorted(set(asked))


@pytest.mark.parametrize("auto_augment", ["augmix-m10-mstd1", "originalr-mstd3"])
def test_other_augmentation_families_survive_zero_bits(auto_augment):
    transform = recipe_transform(auto_augment)
    asked = record_posterize_bits(transform)
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (32, 32, 3), np.uint8))
    for index in range(150):
        with seeded_global_rngs(sample_seed_words(0, 0, index)):
            transform(image)
    assert 0 in asked, sorted(set(asked))


class FailOnSize:
    """A transform step that raises for images of one size (one file of the tiny folder)."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        if image.size == self.size:
            raise ValueError("cannot handle\nthis image")
        return image


def with_failing_first_step(transform: TransformSteps, size: tuple[int, int]) -> TransformSteps:
    return TransformSteps([("FailOnSize", FailOnSize(size))] + transform.steps)


@pytest.fixture()
def data_with_odd_image(tmp_path) -> tuple[Path, Path]:
    """A tiny ImageFolder whose train/green/green_002.png alone is 17x29 pixels."""
    data = make_tiny_imagefolder(tmp_path / "data")
    for path in (data / "train").rglob("*.png"):
        with Image.open(path) as image:
            if image.size == (17, 29):
                image.resize((18, 29)).save(path)
    odd = data / "train" / "green" / "green_002.png"
    Image.new("RGB", (17, 29), (30, 200, 40)).save(odd)
    return data, odd


@pytest.mark.parametrize("workers", [0, 1])
def test_transform_failure_names_the_step_sample_and_epoch(data_with_odd_image, workers):
    data, odd = data_with_odd_image
    transform = with_failing_first_step(recipe_transform("rand-m9-mstd0.5-inc1"), (17, 29))
    dataset = make_image_folder(data / "train", transform)
    index = [path for path, _ in dataset.samples].index(str(odd))
    loader = train_loader(dataset, batch_size=4, rank=0, world_size=1, seed=0, workers=workers,
                          pin_memory=False)
    loader.sampler.set_epoch(3)
    with pytest.raises(DataTransformError) as caught:
        for _ in loader:
            pass
    error = caught.value
    assert (error.split, error.epoch, len(error.failures)) == ("train", 3, 1)
    message = str(error)
    assert "\n" not in message
    for fragment in ("train pass of epoch 4", f"image {index} ({odd})",
                     "FailOnSize raised ValueError: cannot handle this image"):
        assert fragment in message, message


@pytest.mark.slow
def test_cli_stops_with_one_line_naming_the_failed_transform(data_with_odd_image, tmp_path,
                                                             monkeypatch, capsys):
    data, odd = data_with_odd_image
    real_train_transform = train_cli.train_transform
    monkeypatch.setattr(train_cli, "train_transform", lambda *args, **kwargs:
                        with_failing_first_step(real_train_transform(*args, **kwargs), (17, 29)))
    argv = ["--model", "test_convnext", "--data-dir", str(data), "--output", str(tmp_path / "run"),
            "--epochs", "2", "--batch-size", "8", "--img-size", "32", "--device", "cpu",
            "--amp", "none", "--workers", "0", "--warmup-epochs", "1", "--no-progress"]
    assert train_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if "error" in line]  # the rest is the log
    assert line.startswith("train.py: error: a data transform failed in the train pass of epoch 1")
    assert str(odd) in line and "FailOnSize raised ValueError" in line and "--resume auto" in line


# ---------------------------------------------------------------- --aa grammar --------------

def resolve_with_aa(auto_augment: str):
    return resolve_train_config(["--config", "vmamba2d_tiny", "--data-dir", "d", "--output", "o",
                                 "--aa", auto_augment])


@pytest.mark.parametrize("auto_augment, problem", [
    ("rand-zz", "section 'zz' has no number"),
    ("rand-m9-mstd", "section 'mstd' has no number"),
    ("rand--m9", "section '' has no number"),
    ("rand-m9-tfoo", "names no RandAugment transform set"),
    ("rand-m9-m5", "repeats 'm'"),
    ("rand-m9-mstd0.5-inc1-mstd1", "repeats 'mstd'"),
    ("rand-m9x", "needs an integer after 'm'"),
    ("rand-w0", "unknown key 'w'"),
    ("randaugment-m9", "unknown augmentation 'randaugment'"),
    ("augmix-m3-severe", "section 'severe' has no number"),
    ("original-zz", "section 'zz' has no number"),
    ("v1", "unknown augmentation 'v1'"),
])
def test_aa_strings_timm_would_ignore_or_refuse_are_rejected(auto_augment, problem):
    with pytest.raises(UsageError) as caught:
        resolve_with_aa(auto_augment)
    message = str(caught.value)
    assert message.startswith(f"--aa {auto_augment!r}") and problem in message, message
    grammar = {"rand": "'rand[-m<int>]", "augm": "'augmix[-m<int>]"}.get(auto_augment[:4],
                                                                         "'<original|")
    assert f"expected {grammar}" in message or "expected 'rand[" in message, message


def test_timm_silently_ignores_what_is_rejected():
    """The reason for the check: timm builds 'rand-m9-zz' as if it were 'rand-m9'."""
    from timm.data.auto_augment import rand_augment_transform
    ignored = rand_augment_transform("rand-m9-zz-tfoo", {})
    plain = rand_augment_transform("rand-m9", {})
    assert [repr(op) for op in ignored.ops] == [repr(op) for op in plain.ops]


@pytest.mark.parametrize("auto_augment", [
    "rand-m9-mstd0.5-inc1", "rand", "rand-m7-n3-p0.4-mmax12-inc0", "rand-m9-tweights",
    "rand-m9-t3a", "augmix-m5-w4-d2-a1.0-b1", "original-mstd0.5", "originalr", "v0", "v0r", "3a",
])
def test_aa_strings_of_the_grammar_are_accepted_and_built_by_timm(auto_augment):
    assert resolve_with_aa(auto_augment).aa == auto_augment
    assert any(name.endswith(f"(--aa {auto_augment})")
               for name, _ in recipe_transform(auto_augment).steps)


def test_bad_aa_stops_the_cli_before_anything_is_written(tmp_path, capsys):
    output = tmp_path / "run"
    argv = ["--model", "test_convnext", "--data-dir", str(tmp_path / "data"), "--output",
            str(output), "--aa", "rand-zz"]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: --aa 'rand-zz'") and len(err.splitlines()) == 1
    assert not output.exists()


@pytest.mark.parametrize("auto_augment, problem", [
    ("rand-m99", "magnitude m99 is above timm's maximum 10 (timm would silently clip it to 10)"),
    ("rand-m9-mmax5", "magnitude m9 is above its -mmax"),
    ("augmix-m11", "magnitude m11 is above timm's maximum 10"),
    ("rand-m9-p2", "p2 is a probability: it must be in [0, 1]"),
])
def test_aa_values_timm_would_clip_or_misread_are_rejected(auto_augment, problem):
    with pytest.raises(UsageError) as caught:
        resolve_with_aa(auto_augment)
    assert str(caught.value).startswith(f"--aa {auto_augment!r}: ") and problem in str(caught.value)
    resolve_with_aa("rand-m10-p0.5")  # the limits themselves are fine
