"""timm models: 2DVMamba (``vmamba2d_*``) and the VMamba v2 baseline (``vmamba_*``).

Importing this package registers the models with timm.
"""
from .ss2d import SS2D
from .vmamba import VMamba, VMambaStage, VSSBlock, default_cfgs
from .weights import checkpoint_filter_fn, convert_official_vmamba, official_checkpoint_loading

__all__ = [
    "SS2D",
    "VMamba",
    "VMambaStage",
    "VSSBlock",
    "checkpoint_filter_fn",
    "convert_official_vmamba",
    "default_cfgs",
    "official_checkpoint_loading",
]
