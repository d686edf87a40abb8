"""2D selective-scan operators."""
from .scan_torch import selective_scan_2d_reference, selective_scan_2d_torch
from .selective_scan_2d import BACKENDS, backend_info, resolve_backend, selective_scan_2d

__all__ = [
    "BACKENDS",
    "backend_info",
    "resolve_backend",
    "selective_scan_2d",
    "selective_scan_2d_reference",
    "selective_scan_2d_torch",
]
