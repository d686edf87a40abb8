"""vmamba2d: 2D selective state-space vision backbones (2DVMamba) for PyTorch and timm.

``import vmamba2d`` registers the models with timm and loads the scan ops; it prints nothing and
loads none of the optional packages: ONNX export is :mod:`vmamba2d.export` (importing it registers
the scan ops' ONNX translations for the bare ``torch.onnx.export``), the glibc allocator tuning
the training scripts use is :mod:`vmamba2d.cpu_malloc`, and triton is imported only when its
backend is considered.
"""
from . import ops
from . import models
from .flops import count_flops

__all__ = ["count_flops", "models", "ops"]

__version__ = "0.1.0"  # the one place the version is set; setup.py reads it from here
