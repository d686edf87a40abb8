"""ImageNet-layout folders, timm transforms and (distributed) data loaders.

Layout: ``<data-dir>/train/<class>/<image>`` and ``<data-dir>/val/<class>/<image>``; the class
list (sorted folder names) must be identical in both splits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader, DistributedSampler, Sampler, default_collate
from torchvision.datasets import ImageFolder

from vmamba2d.runs import EpochSampler, SeededSamples, loader_generator

from .auto_augment import is_auto_augment, use_safe_posterize
from .errors import BadImageError, DataTransformError, UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_classes(split_dir: Path, what: str) -> list[str]:
    """Sorted class folder names of one split; errors for a missing split or empty class."""
    if not split_dir.is_dir():
        raise UsageError(f"{what}: folder not found: {split_dir}")
    classes = sorted(entry.name for entry in split_dir.iterdir() if entry.is_dir())
    if not classes:
        raise UsageError(f"{what}: {split_dir} has no class sub-folders (expected "
                         f"{split_dir}/<class>/<image>)")
    empty = [name for name in classes
             if not any(f.suffix.lower() in IMAGE_EXTENSIONS for f in (split_dir / name).rglob("*"))]
    if empty:
        raise UsageError(f"{what}: class folder(s) without images ({', '.join(IMAGE_EXTENSIONS)}) in "
                         f"{split_dir}: {', '.join(empty[:10])}" + (" ..." if len(empty) > 10 else ""))
    return classes


def check_train_val_classes(data_dir: Path) -> list[str]:
    """The shared class list of ``data_dir/train`` and ``data_dir/val`` (error if they differ)."""
    if not data_dir.is_dir():
        raise UsageError(f"--data-dir: folder not found: {data_dir}")
    train = list_classes(data_dir / "train", "--data-dir train split")
    val = list_classes(data_dir / "val", "--data-dir val split")
    if train != val:
        only_train = sorted(set(train) - set(val))
        only_val = sorted(set(val) - set(train))
        raise UsageError(
            f"--data-dir: class folders differ between train ({len(train)}) and val ({len(val)}): "
            f"only in train: {only_train[:10]}, only in val: {only_val[:10]}")
    return train


def resolve_val_dir(data_dir: Path) -> Path:
    """``data_dir/val`` when it exists, else ``data_dir`` itself (a bare class-folder tree)."""
    return data_dir / "val" if (data_dir / "val").is_dir() else data_dir


def model_data_config(model: torch.nn.Module, img_size: int, interpolation: Optional[str],
                      crop_pct: Optional[float]) -> dict[str, Any]:
    """timm data config (input_size, interpolation, mean, std, crop_pct) with our overrides."""
    overrides: dict[str, Any] = {"input_size": (3, img_size, img_size)}
    if interpolation is not None:
        overrides["interpolation"] = interpolation
    if crop_pct is not None:
        overrides["crop_pct"] = crop_pct
    return resolve_data_config(overrides, model=model)


class TransformStepError(Exception):
    """One step of a :class:`TransformSteps` pipeline raised (message names the step)."""


class TransformSteps:
    """Apply ``steps`` in order, like torchvision's Compose; an exception of a step becomes a
    TransformStepError naming the step and the original error (type and message)."""

    def __init__(self, steps: Sequence[tuple[str, Any]]) -> None:
        self.steps = list(steps)

    def __call__(self, image: Any) -> Any:
        for name, step in self.steps:
            try:
                image = step(image)
            except Exception as error:  # noqa: BLE001 - re-raised with the step's name
                detail = " ".join(str(error).split())
                raise TransformStepError(f"{name} raised {type(error).__name__}: {detail}"
                                         ) from error
        return image

    def __repr__(self) -> str:
        return "TransformSteps(" + ", ".join(name for name, _ in self.steps) + ")"


def _named_steps(compose: Any, auto_augment: Optional[str]) -> TransformSteps:
    """timm's Compose as a :class:`TransformSteps`; the auto-augment step gets posterize ops
    that work with any Pillow (see ``classification.auto_augment``)."""
    steps = []
    for step in compose.transforms:
        name = type(step).__name__
        if is_auto_augment(step):
            use_safe_posterize(step)
            name = f"{name} (--aa {auto_augment})"
        steps.append((name, step))
    if auto_augment and not any(is_auto_augment(step) for _, step in steps):
        raise RuntimeError(f"timm built no auto-augment step for --aa {auto_augment!r}")
    return TransformSteps(steps)


def eval_transform(data_config: dict[str, Any]) -> TransformSteps:
    """Resize to img_size / crop_pct (shorter side), centre-crop img_size, normalise.

    PIL image -> float tensor (3, img_size, img_size)."""
    return _named_steps(create_transform(
        data_config["input_size"], is_training=False, interpolation=data_config["interpolation"],
        mean=data_config["mean"], std=data_config["std"], crop_pct=data_config["crop_pct"],
        crop_mode=data_config.get("crop_mode")), None)


def train_transform(data_config: dict[str, Any], *, auto_augment: Optional[str], color_jitter: float,
                    re_prob: float, re_mode: str, re_count: int) -> TransformSteps:
    """Random-resized crop + flip + RandAugment/colour jitter + normalise + random erasing.

    PIL image -> float tensor (3, img_size, img_size). The auto-augment step is timm's, with
    posterize ops that work with any Pillow (``classification.auto_augment``).
    """
    try:
        compose = create_transform(data_config["input_size"], is_training=True,
                                   auto_augment=auto_augment, color_jitter=color_jitter,
                                   interpolation=data_config["interpolation"],
                                   mean=data_config["mean"], std=data_config["std"],
                                   re_prob=re_prob, re_mode=re_mode, re_count=re_count)
    except (AssertionError, ValueError, KeyError) as error:
        raise UsageError(f"--aa {auto_augment!r}: timm cannot build this augmentation ({error})"
                         ) from error
    return _named_steps(compose, auto_augment)


class ShardSampler(Sampler[int]):
    """Rank r takes indices r, r + world, r + 2·world, ... (no padding, so sums over ranks are exact)."""

    def __init__(self, num_samples: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, num_samples, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


# What PIL raises for a missing, truncated or corrupt file (or a decompression bomb).
UNREADABLE_IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
MAX_CONSECUTIVE_BAD_IMAGES = 16


class ReadableImageFolder(ImageFolder):
    """ImageFolder whose samples are ``(image, target, problem)``.

    ``problem`` is ``""`` for a readable file. For an unreadable one it is ``"<path>: <error>"``
    and the image / target are those of the next readable file of the split (the batch keeps
    its size); the training loop then stops or skips (``--skip-bad-images``), and evaluation
    leaves such rows out. More than MAX_CONSECUTIVE_BAD_IMAGES unreadable files in a row raise.
    When the transform raises, ``image`` is None and ``problem`` a :class:`TransformFailure`;
    the loaders of this module (:func:`collate_samples`) then raise DataTransformError in the
    main process, naming the sample, the transform step and the error (a worker's own exception
    would arrive as a traceback text).
    """

    def __getitem__(self, index: int) -> tuple[Any, int, Any]:
        path, target = self.samples[index]
        try:
            image = self.loader(path)
            problem: Any = ""
        except UNREADABLE_IMAGE_ERRORS as error:
            problem = f"{path}: {error}"
            image, target, path = self._next_readable(index)
        if self.transform is not None:
            try:
                image = self.transform(image)
            except Exception as error:  # noqa: BLE001 - raised by the loader, see the docstring
                return None, target, TransformFailure(index, path, describe_error(error))
        return image, target, problem

    def _next_readable(self, index: int) -> tuple[Any, int, str]:
        tried = []
        for offset in range(1, min(MAX_CONSECUTIVE_BAD_IMAGES, len(self.samples))):
            path, target = self.samples[(index + offset) % len(self.samples)]
            try:
                return self.loader(path), target, path
            except UNREADABLE_IMAGE_ERRORS:
                tried.append(path)
        raise BadImageError(f"{self.samples[index][0]} and the {len(tried)} image(s) after it "
                            f"cannot be read ({', '.join(tried[:3])} ...); is {self.root} intact?")


def describe_error(error: BaseException) -> str:
    """One line: a TransformStepError's message, else ``"<Type>: <message>"``."""
    if isinstance(error, TransformStepError):
        return str(error)
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


@dataclass(frozen=True)
class TransformFailure:
    """A sample whose transform raised: its index in the data set, its file and what failed."""

    index: int
    path: str
    error: str

    def __str__(self) -> str:
        return f"image {self.index} ({self.path}): {self.error}"


def collate_samples(batch: list[tuple[Any, int, Any]]) -> Any:
    """``default_collate`` of ``(image, target, problem)`` samples, or, when a transform failed
    on any of them, the list of their :class:`TransformFailure` (reported by the loader)."""
    failures = [problem for _, _, problem in batch if isinstance(problem, TransformFailure)]
    return failures if failures else default_collate(batch)


class SampleLoader(DataLoader):
    """DataLoader of :class:`ReadableImageFolder` batches (``collate_fn=collate_samples``) that
    raises DataTransformError for a batch with failed transforms, naming ``split`` and, when
    the sampler has one (EpochSampler), the epoch."""

    def __init__(self, dataset: Any, *, split: str, **kwargs: Any) -> None:
        super().__init__(dataset, collate_fn=collate_samples, **kwargs)
        self.split = split

    def __iter__(self) -> Iterator[Any]:
        for batch in super().__iter__():
            if isinstance(batch, list) and batch and isinstance(batch[0], TransformFailure):
                raise DataTransformError([str(failure) for failure in batch], self.split,
                                         getattr(self.sampler, "epoch", None))
            yield batch


def make_image_folder(split_dir: Path, transform, expected_classes: Optional[Sequence[str]] = None
                      ) -> ReadableImageFolder:
    """:class:`ReadableImageFolder` over ``split_dir``; classes checked against
    ``expected_classes``."""
    dataset = ReadableImageFolder(str(split_dir), transform=transform)
    if expected_classes is not None and list(dataset.classes) != list(expected_classes):
        raise UsageError(f"{split_dir}: classes {dataset.classes[:10]} do not match the expected "
                         f"{list(expected_classes)[:10]}")
    return dataset


def train_loader(dataset: ImageFolder, *, batch_size: int, rank: int, world_size: int, seed: int,
                 workers: int, pin_memory: bool) -> SampleLoader:
    """Shuffled loader of ``(images, targets, problems)`` batches; call ``sampler.set_epoch``.

    Order: DistributedSampler seeded with (seed, epoch), even for 1 process. Augmentation:
    seeded per sample from (seed, epoch, index) (``vmamba2d.runs.seeding``), so a resumed
    run loads exactly what the uninterrupted run loaded, with any number of ``workers``.
    Full batches only (mixup needs even, equal batches); each rank sees len/world images per
    epoch.
    """
    if len(dataset) < batch_size * world_size:
        raise UsageError(f"train split has {len(dataset)} images, fewer than one batch "
                         f"({batch_size} per process x {world_size} processes)")
    sampler = EpochSampler(DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                              shuffle=True, seed=seed, drop_last=True))
    return SampleLoader(SeededSamples(dataset, seed), split="train", batch_size=batch_size,
                        sampler=sampler, num_workers=workers, pin_memory=pin_memory,
                        drop_last=True, persistent_workers=workers > 0,
                        generator=loader_generator(seed))


def eval_loader(dataset: ImageFolder, *, batch_size: int, rank: int, world_size: int,
                workers: int, pin_memory: bool) -> SampleLoader:
    """Ordered loader over this rank's shard (every image counted exactly once over all ranks).

    Its own generator: iterating it never draws from the global torch generator."""
    sampler = ShardSampler(len(dataset), rank, world_size)
    return SampleLoader(dataset, split="val", batch_size=batch_size, sampler=sampler,
                        num_workers=workers, pin_memory=pin_memory, drop_last=False,
                        generator=loader_generator(0))


def updates_per_epoch(batches_per_epoch: int, accum_steps: int) -> int:
    """Optimizer updates in one epoch (the last, shorter accumulation group still updates)."""
    return math.ceil(batches_per_epoch / accum_steps)
