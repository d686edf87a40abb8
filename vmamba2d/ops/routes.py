"""Scan routes over an H x W map, described in the map's own coordinates.

A route says where a scan starts and which axis it walks first:

    from_bottom    the scan starts at the last row and walks up (else the first row, walking down)
    from_right     the scan starts at the last column and walks left (else the first, walking right)
    columns_first  2D: the first pass runs down the columns, the second along the rows
                   (else along the rows first: the paper's horizontal-then-vertical order);
                   flat: the sequence is column-major (else row-major)
    flat           a 1D scan over the flattened sequence whose state runs on from the end of one
                   row (column) into the next, as VMamba's flattened routes do (else the 2D scan)

For a rows-first 2D route from the top-left corner, per cell (i, j) with decay a and input x::

    hh[i, j] = a[i, j] * hh[i, j - 1] + x[i, j]      (first pass, along the row)
    h[i, j]  = a[i, j] * h[i - 1, j]  + hh[i, j]     (second pass, down the column)

and every other 2D route is this recurrence on the map flipped along ``from_bottom`` /
``from_right`` and, for ``columns_first``, transposed. VMamba v2's four cross-scan routes are
``CROSS_ROUTES`` (2DVMamba scans them as 2D routes, VMamba as flat ones):

    k0  row-major sequence                  Route()
    k1  column-major sequence               Route(columns_first=True)
    k2  k0 reversed (the map rotated 180)   Route(from_bottom=True, from_right=True)
    k3  k1 reversed                         Route(from_bottom=True, from_right=True, columns_first=True)

Every route is a permutation of the map's cells, so ``to_route_order`` / ``from_route_order``
express it with flips and a transpose; kernels that scan in place use the same description as
index arithmetic (``Route.code``).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple, Union

import torch

Tensor = torch.Tensor


class Route(NamedTuple):
    """One scan route over a map (see the module docstring for the four flags)."""

    from_bottom: bool = False
    from_right: bool = False
    columns_first: bool = False
    flat: bool = False

    @property
    def code(self) -> int:
        """The route as the bit field the kernels take: 1 from_right, 2 from_bottom,
        4 columns_first, 8 flat."""
        return int(self.from_right) | int(self.from_bottom) << 1 | int(self.columns_first) << 2 | int(self.flat) << 3

    @classmethod
    def from_code(cls, code: int) -> "Route":
        """Inverse of :attr:`code`."""
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code < 16:
            raise ValueError(f"a route code must be an int in [0, 16), got {code!r}")
        return cls(from_bottom=bool(code & 2), from_right=bool(code & 1), columns_first=bool(code & 4), flat=bool(code & 8))

    def grid(self, height: int, width: int) -> Tuple[int, int]:
        """The (rows, columns) grid the route's sequence is scanned on: (1, H*W) for a flat route,
        (W, H) for a columns-first 2D route, else (H, W)."""
        if self.flat:
            return 1, height * width
        return (width, height) if self.columns_first else (height, width)


CROSS_ROUTES: Tuple[Route, ...] = (
    Route(),
    Route(columns_first=True),
    Route(from_bottom=True, from_right=True),
    Route(from_bottom=True, from_right=True, columns_first=True),
)
# One route from each corner, alternating the pass order like CROSS_ROUTES: with these a single
# mixer sees every quadrant around a pixel (CROSS_ROUTES reach only the top-left and bottom-right).
CORNER_ROUTES: Tuple[Route, ...] = (
    Route(),
    Route(from_right=True, columns_first=True),
    Route(from_bottom=True, from_right=True),
    Route(from_bottom=True, columns_first=True),
)
ROUTE_SETS = {"cross": CROSS_ROUTES, "corners": CORNER_ROUTES}
SCAN_KINDS = ("2d", "1d")

RoutesArg = Union[str, Sequence[Route]]


def route_set(name: str, scan: str = "2d") -> Tuple[Route, ...]:
    """The named route set (``"cross"``: the paper's, ``"corners"``: one route per corner) as 2D
    routes (``scan="2d"``) or flat 1D routes (``scan="1d"``)."""
    if name not in ROUTE_SETS:
        raise ValueError(f"routes must be one of {tuple(ROUTE_SETS)} or a sequence of Route, got {name!r}")
    if scan not in SCAN_KINDS:
        raise ValueError(f"scan must be one of {SCAN_KINDS}, got {scan!r}")
    return tuple(r._replace(flat=scan == "1d") for r in ROUTE_SETS[name])


def resolve_routes(routes: RoutesArg) -> Tuple[Route, ...]:
    """A route-set name (2D routes) or a sequence of :class:`Route` / codes -> a tuple of Route."""
    if isinstance(routes, str):
        return route_set(routes)
    if isinstance(routes, torch.Tensor) or not isinstance(routes, Sequence) or len(routes) == 0:
        raise ValueError(f"routes must be a route-set name or a non-empty sequence of Route, got {routes!r}")
    return tuple(r if isinstance(r, Route) else Route.from_code(r) for r in routes)


def to_route_order(x: Tensor, route: Route) -> Tensor:
    """A map (..., H, W) as the route's sequence (..., L), in the order the route visits it.

    Reshaped to ``route.grid(H, W)`` the sequence is the grid the route scans from its top-left.
    """
    if route.from_bottom:
        x = x.flip(-2)
    if route.from_right:
        x = x.flip(-1)
    if route.columns_first:
        x = x.transpose(-1, -2)
    return x.flatten(-2)


def from_route_order(seq: Tensor, route: Route, height: int, width: int) -> Tensor:
    """Inverse of :func:`to_route_order`: a route's sequence (..., L) back to the map (..., H, W)."""
    rows, cols = (width, height) if route.columns_first else (height, width)
    x = seq.unflatten(-1, (rows, cols))
    if route.columns_first:
        x = x.transpose(-1, -2)
    if route.from_right:
        x = x.flip(-1)
    if route.from_bottom:
        x = x.flip(-2)
    return x
