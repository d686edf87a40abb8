"""2D selective-scan operators: the single-route scan and the four-route scan of a map.

    selective_scan_2d / cross_selective_scan_2d       the ops, any backend (:mod:`.interface`)
    selective_scan_2d_reference,                      the readable references, same arguments
    cross_selective_scan_2d_reference                 (:mod:`.reference`)
    selective_scan_2d_torch                           the vectorised torch backend
    cross_selective_scan_2d_compiled                  the four-route op on the compiled kernel with
                                                      no backend choice (what TorchScript runs)
    BACKENDS, resolve_backend, backend_info           which backend runs
    Route, CROSS_ROUTES, CORNER_ROUTES, ROUTE_SETS,   the routes (:mod:`.routes`)
    route_set, to_route_order, from_route_order
"""
from .compiled.cross_ops import cross_selective_scan_2d_compiled
from .interface import BACKENDS, backend_info, cross_selective_scan_2d, resolve_backend, selective_scan_2d
from .reference import cross_selective_scan_2d_reference, selective_scan_2d_reference, selective_scan_2d_torch
from .routes import CORNER_ROUTES, CROSS_ROUTES, ROUTE_SETS, Route, from_route_order, route_set, to_route_order

__all__ = [
    "BACKENDS",
    "CORNER_ROUTES",
    "CROSS_ROUTES",
    "ROUTE_SETS",
    "Route",
    "backend_info",
    "cross_selective_scan_2d",
    "cross_selective_scan_2d_compiled",
    "cross_selective_scan_2d_reference",
    "from_route_order",
    "resolve_backend",
    "route_set",
    "selective_scan_2d",
    "selective_scan_2d_reference",
    "selective_scan_2d_torch",
    "to_route_order",
]
