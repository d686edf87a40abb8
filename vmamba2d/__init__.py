"""vmamba2d: 2D selective state-space vision backbones (2DVMamba) for PyTorch and timm."""
from . import ops
from . import models

__version__ = "0.1.0"
