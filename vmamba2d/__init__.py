"""vmamba2d: 2D selective state-space vision backbones (2DVMamba) for PyTorch and timm."""
from . import ops
from . import models
from .cpu_malloc import cpu_malloc_info, keep_freed_memory
from .flops import count_flops
from .export.onnx_registry import register_if_onnx_installed

# With the onnx extra installed, the bare torch.onnx.export(model, x, dynamo=True) finds the scan
# ops' translations (costs ~0.2 s of import time: onnx and onnxscript get imported).
register_if_onnx_installed()

__all__ = ["count_flops", "cpu_malloc_info", "keep_freed_memory", "models", "ops"]

__version__ = "0.1.0"  # the one place the version is set; setup.py reads it from here
