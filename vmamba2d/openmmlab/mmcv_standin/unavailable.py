"""The ``mmcv.ops`` names the stand-in does not implement: placeholders that import fine and raise
a one-line "not available without full mmcv" error when a class is built or a function called.

mmsegmentation and mmdetection import these at module level, so they must exist; UperNet and Mask
R-CNN never run them. Two kinds, one message: ops that are compiled-only in mmcv (deformable
convolution, CARAFE, ...) and ops that have a Python form in mmcv but that no model of this
package calls (soft_nms, nms_match, RoIPool, point sampling, sigmoid focal loss, the NAS-FPN merge
cells, CornerPool).
"""
from __future__ import annotations

from typing import Callable

import torch

PACKAGE = "mmcv.ops"
IMPLEMENTED = ("nms", "batched_nms", "roi_align", "RoIAlign")
INSTALL_HINT = "pip install mmcv==2.1.0, a full build with its compiled ops"

# by the mmcv.ops submodule that defines them in mmcv; CamelCase names are nn.Module classes
UNAVAILABLE_OPS = {
    "carafe": ("CARAFE", "CARAFENaive", "CARAFEPack", "carafe", "carafe_naive"),
    "cc_attention": ("CrissCrossAttention",),
    "corner_pool": ("CornerPool",),
    "deform_conv": ("DeformConv2d", "DeformConv2dPack", "deform_conv2d"),
    "focal_loss": ("sigmoid_focal_loss",),
    "masked_conv": ("MaskedConv2d", "masked_conv2d"),
    "merge_cells": ("BaseMergeCell", "ConcatCell", "GlobalPoolingCell", "SumCell"),
    "modulated_deform_conv": ("ModulatedDeformConv2d", "ModulatedDeformConv2dPack",
                              "modulated_deform_conv2d"),
    "multi_scale_deform_attn": ("MultiScaleDeformableAttention",),
    "nms": ("nms_match", "soft_nms"),
    "point_sample": ("point_sample", "rel_roi_point_to_rel_img_point"),
    "psa_mask": ("PSAMask",),
    "roi_pool": ("RoIPool", "roi_pool"),
}


def unavailable_message(name: str) -> str:
    """The one-line error for the op ``name`` (e.g. ``"soft_nms"``)."""
    return (f"mmcv.ops.{name} is not available without full mmcv ({INSTALL_HINT}): mmcv-lite has "
            f"no compiled ops (mmcv._ext) and vmamba2d's mmcv.ops stand-in provides only "
            f"{', '.join(IMPLEMENTED)}, what UperNet and Mask R-CNN run.")


def unavailable_op(name: str) -> Callable:
    """A placeholder for ``mmcv.ops.<name>``: an nn.Module class that raises NotImplementedError
    when built (CamelCase names; subclassing it still works) or a function that raises when called."""
    if name[0].isupper():
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(unavailable_message(name))

        return type(name, (torch.nn.Module,), {"__init__": __init__, "__module__": PACKAGE})

    def unavailable(*args, **kwargs):
        raise NotImplementedError(unavailable_message(name))

    unavailable.__name__ = unavailable.__qualname__ = name
    unavailable.__module__ = PACKAGE
    return unavailable
