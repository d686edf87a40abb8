"""vmamba2d: 2D selective state-space vision backbones (2DVMamba) for PyTorch and timm."""
from . import ops
from . import models
from .flops import count_flops

__all__ = ["count_flops", "models", "ops"]

__version__ = "0.1.0"  # the one place the version is set; setup.py reads it from here
