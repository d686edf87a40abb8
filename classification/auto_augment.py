"""timm's auto-augmentation (RandAugment, AugMix, AutoAugment) made safe with any Pillow.

timm's Posterize ops keep ``bits`` most significant bits per channel with
``ImageOps.posterize``. RandAugment's ``PosterizeIncreasing`` (the ``inc1`` of the recipe's
``rand-m9-mstd0.5-inc1``) asks for 0 bits when the sampled magnitude reaches 10 (about 1 image
in 700 with ``m9-mstd0.5``), and so can AugMix and the ``originalr`` / ``v0r`` policies. Pillow up
to 12 computed the channel mask ``~(2 ** (8 - bits) - 1)``, which for ``bits <= 0`` clears all 8
bits: a black image (the TensorFlow reference's shift by 8 gives the same). Pillow 13 raises
``ValueError`` for ``bits`` outside 1..8 instead, which stops training.

:func:`use_safe_posterize` swaps the posterize function of exactly these ops, in the one
transform object it is given (timm and Pillow themselves are left unchanged), for
:func:`posterize_keeping_bits`: timm's function with the ``bits <= 0`` case computed as
Pillow < 13 did. With a Pillow < 13 the augmentation is therefore unchanged, draw for draw.
"""
from __future__ import annotations

from typing import Any

from PIL import Image, ImageOps
from timm.data import auto_augment as timm_auto_augment

POSTERIZE_OPS = ("Posterize", "PosterizeIncreasing", "PosterizeOriginal")
_AUGMENT_CONTAINERS = (timm_auto_augment.RandAugment, timm_auto_augment.AugMixAugment,
                       timm_auto_augment.AutoAugment)


def posterize_keeping_bits(image: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """Keep the ``bits_to_keep`` most significant bits of every channel value.

    ``>= 8``: the image itself (as timm does); 1..7: ``ImageOps.posterize``; ``<= 0``: every
    value becomes 0, i.e. a black image, as ``ImageOps.posterize`` computed before Pillow 13
    (L and RGB images, the modes it supported). Extra keyword arguments (timm passes fill
    colour and resampling to every op) are ignored, as in timm.
    """
    if bits_to_keep >= 8:
        return image
    if bits_to_keep >= 1:
        return ImageOps.posterize(image, bits_to_keep)
    if image.mode not in ("L", "RGB"):
        raise ValueError(f"posterize to {bits_to_keep} bits supports L and RGB images, got mode "
                         f"{image.mode}")
    return image.point([0] * 256 * len(image.getbands()))


def augment_ops(step: Any) -> list:
    """The timm ``AugmentOp`` objects of one RandAugment / AugMix / AutoAugment transform."""
    if isinstance(step, (timm_auto_augment.RandAugment, timm_auto_augment.AugMixAugment)):
        return list(step.ops)
    if isinstance(step, timm_auto_augment.AutoAugment):
        return [op for sub_policy in step.policy for op in sub_policy]
    raise TypeError(f"not a timm auto-augment transform: {type(step).__name__}")


def is_auto_augment(step: Any) -> bool:
    """True for the transform timm builds from an auto-augment string."""
    return isinstance(step, _AUGMENT_CONTAINERS)


def use_safe_posterize(step: Any) -> int:
    """Make the posterize ops of ``step`` (one timm auto-augment transform) use
    :func:`posterize_keeping_bits`; returns how many ops were changed.

    Raises RuntimeError when a posterize op does not call timm's posterize function (a timm
    version this was not written for), instead of leaving the op as it is.
    """
    changed = 0
    for op in augment_ops(step):
        if op.name not in POSTERIZE_OPS:
            continue
        if op.aug_fn is not timm_auto_augment.posterize and op.aug_fn is not posterize_keeping_bits:
            raise RuntimeError(f"timm's {op.name} op calls {op.aug_fn!r}, not "
                               "timm.data.auto_augment.posterize: this timm version is not "
                               "supported by classification/auto_augment.py")
        op.aug_fn = posterize_keeping_bits
        changed += 1
    return changed
