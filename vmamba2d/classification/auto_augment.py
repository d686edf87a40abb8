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

:func:`check_auto_augment` validates an auto-augment string against the grammar timm parses,
rejecting what timm would silently ignore (sections without a number such as ``rand-zz``,
unknown RandAugment transform sets, repeated keys).
"""
from __future__ import annotations

import re
from typing import Any

from PIL import Image, ImageOps
from timm.data import auto_augment as timm_auto_augment

from .errors import UsageError

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


# The sections timm's RandAugment, AugMix and AutoAugment parsers act on: key -> value pattern.
_INT, _FLOAT, _BOOL = r"\d+", r"\d+(?:\.\d*)?", r"[01]"
_RAND_KEYS = {"m": _INT, "n": _INT, "p": _FLOAT, "mstd": _FLOAT, "mmax": _INT, "inc": _BOOL}
_RAND_TRANSFORM_SETS = ("weights", "3a", "3aw")  # the t<name> section
_AUGMIX_KEYS = {"m": _INT, "w": _INT, "d": _INT, "a": _FLOAT, "b": _BOOL, "mstd": _FLOAT}
_POLICY_KEYS = {"mstd": _FLOAT}
AUTO_AUGMENT_POLICIES = ("original", "originalr", "v0", "v0r", "3a")
_RAND_GRAMMAR = ("'rand[-m<int>][-n<int>][-p<float>][-mstd<float>][-mmax<int>][-inc<0|1>]"
                 f"[-t<{'|'.join(_RAND_TRANSFORM_SETS)}>]' (RandAugment, e.g. "
                 "rand-m9-mstd0.5-inc1)")
_AUGMIX_GRAMMAR = "'augmix[-m<int>][-w<int>][-d<int>][-a<float>][-b<0|1>][-mstd<float>]' (AugMix)"
_POLICY_GRAMMAR = f"'<{'|'.join(AUTO_AUGMENT_POLICIES)}>[-mstd<float>]' (AutoAugment policy)"
AUTO_AUGMENT_GRAMMAR = f"{_RAND_GRAMMAR}, {_AUGMIX_GRAMMAR}, {_POLICY_GRAMMAR}, or 'none'"


def check_auto_augment(text: str) -> None:
    """UsageError naming ``--aa`` and the expected grammar (:data:`AUTO_AUGMENT_GRAMMAR`)
    unless ``text`` follows it.

    timm picks the family by prefix (``rand``..., ``augmix``..., else a policy name), splits
    the rest at ``-`` and reads each section as a key followed by a number; it skips sections
    without a digit, falls back to the default transforms for an unknown ``t<name>`` and keeps
    one of two repeated keys, silently. All of those are errors here.
    """
    sections = text.split("-")
    family, options = sections[0], sections[1:]
    if text.startswith("rand"):
        expected, keys, grammar = "rand", _RAND_KEYS, _RAND_GRAMMAR
    elif text.startswith("augmix"):
        expected, keys, grammar = "augmix", _AUGMIX_KEYS, _AUGMIX_GRAMMAR
    else:
        expected, keys, grammar = None, _POLICY_KEYS, _POLICY_GRAMMAR
    if (family != expected) if expected else (family not in AUTO_AUGMENT_POLICIES):
        raise UsageError(f"--aa {text!r}: unknown augmentation {family!r}; expected "
                         f"{AUTO_AUGMENT_GRAMMAR}")
    seen: dict[str, str] = {}
    for section in options:
        key, problem = _parse_section(section, keys, transform_sets=family == "rand")
        if problem is None and key in seen:
            problem = f"repeats '{key}' (timm would use only one of them)"
        if problem is not None:
            raise UsageError(f"--aa {text!r}: section {section!r} {problem}; expected {grammar}, "
                             "sections separated by '-'")
        seen[key] = section[len(key):]
    _check_ranges(text, seen)


_MAGNITUDE_MAX = 10  # timm's _LEVEL_DENOM: magnitudes above it are clipped to it


def _check_ranges(text: str, values: dict[str, str]) -> None:
    """UsageError for values timm would clip (magnitude above its maximum) or misread (a
    probability above 1)."""
    limit = int(values.get("mmax", _MAGNITUDE_MAX))
    if "m" in values and int(values["m"]) > limit:
        source = "its -mmax" if "mmax" in values else f"timm's maximum {_MAGNITUDE_MAX}"
        raise UsageError(f"--aa {text!r}: magnitude m{values['m']} is above {source} (timm would "
                         f"silently clip it to {limit}); use m0..m{limit}")
    if "p" in values and float(values["p"]) > 1:
        raise UsageError(f"--aa {text!r}: p{values['p']} is a probability: it must be in [0, 1]")


def _parse_section(section: str, keys: dict[str, str], transform_sets: bool
                   ) -> tuple[str, str | None]:
    """(key, None) for a valid section, else (key, what is wrong)."""
    if transform_sets and section.startswith("t"):
        if section[1:] in _RAND_TRANSFORM_SETS:
            return "t", None
        return "t", (f"names no RandAugment transform set (t{'|t'.join(_RAND_TRANSFORM_SETS)}; "
                     "timm would silently use the default set)")
    match = re.fullmatch(r"([^\d]*)(\d.*)", section)
    if match is None:
        return section, "has no number (timm would silently ignore it)"
    key, value = match.groups()
    if key not in keys:
        return key, f"has the unknown key '{key}' (keys: {', '.join(keys)})"
    if re.fullmatch(keys[key], value) is None:
        kind = {_INT: "an integer", _FLOAT: "a number", _BOOL: "0 or 1"}[keys[key]]
        return key, f"needs {kind} after '{key}', got '{value}'"
    return key, None
