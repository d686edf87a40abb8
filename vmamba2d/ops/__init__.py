"""2D selective-scan operators: the single-route scan and the four-route scan of a map."""
from .cross_scan import cross_selective_scan_2d
from .routes import CORNER_ROUTES, CROSS_ROUTES, ROUTE_SETS, Route, route_set
from .scan_torch import selective_scan_2d_reference, selective_scan_2d_torch
from .selective_scan_2d import BACKENDS, backend_info, resolve_backend, selective_scan_2d

__all__ = [
    "BACKENDS",
    "CORNER_ROUTES",
    "CROSS_ROUTES",
    "ROUTE_SETS",
    "Route",
    "backend_info",
    "cross_selective_scan_2d",
    "resolve_backend",
    "route_set",
    "selective_scan_2d",
    "selective_scan_2d_reference",
    "selective_scan_2d_torch",
]
