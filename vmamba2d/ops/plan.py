"""The rule that picks the GPU scan design of a call, for the CUDA and the Triton backends alike.

A design is picked from the call's shape alone -- N (d_state), H, W, the input type, the routes,
the direction and whether a gradient is needed -- never by timing (docs/kernels.md, "Planner and
tuner"). The rows below are tried in order; the first that matches names the designs the call may
take, in order of preference:

  0. backward (CUDA), N = 1, inputs of one type among fp32 / fp16 /
     bf16, every route 2D (codes 0-7), W <= 128 (32 lanes of 4
     columns)                                                      -> RS, v3
  1. backward, or a forward that saves what a backward reads      -> v3
  2. N != 1                                                        -> v3
  3. inputs not all of one type among fp32 / fp16 / bf16           -> v3
  4. a route that the backend's RS kernel does not stream (CUDA,
     several routes: the four-route kernel runs VMamba's cross
     routes, codes 0, 4, 3, 7, only)                               -> v3
  5. L = H * W <= 64                                               -> PL, RS, v3
  6. W <= the backend's RS width (CUDA: 32 lanes x 16 bytes,
     i.e. 128 fp32 / 256 fp16 and bf16 columns; the four-route
     kernel 32 lanes of 4 fp16 / bf16 or 2 fp32 columns, 128 / 64;
     Triton: 256)                                                  -> RS, v3
  7. otherwise                                                     -> v3

v3 is the tiled kernels (the CUDA v3 scan, Triton's tiled kernels). A backend runs the first
design of the row that it has a kernel for (``built``); a design passed over for want of a kernel
is named in the plan's reason ("PL (...): not built for cuda"). The RS backward (row 0) is the
four-route op's route passes (vmamba2d.ops.compiled.cross_rows_backward) and the single-route op's
saving forward and RS backward (vmamba2d.ops.compiled.rows_route_backward); until a GPU run has
measured it against v3, ``VMAMBA2D_SCAN_BACKWARD`` keeps v3 unless set to ``auto`` (:func:`backward_pin`).
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Collection, Optional

import torch

from .compiled.rows_plan import CROSS_ROUTE_CODES, WARP_LANES, cross_max_width, describe_cross, route_streams_rows
from .settings import env_choice

DESIGNS = ("pl", "rs", "v3")
# The designs each GPU path has kernels for (its ``built``), per op; the launchers read theirs from here.
BUILT = {"cuda single-route": ("pl", "rs", "v3"), "cuda four-route": ("rs", "v3"), "triton single-route": ("rs", "v3"),
         "cuda four-route backward": ("rs", "v3"), "cuda single-route backward": ("rs", "v3")}
BACKENDS = ("cuda", "triton")
PL_MAX_CELLS = 64
RS_BACKWARD_MAX_WIDTH = WARP_LANES * 4  # the RS backward's widest lane holds 4 columns
BACKWARD_ENV = "VMAMBA2D_SCAN_BACKWARD"
BACKWARD_CHOICES = ("v3", "auto")
TRITON_RS_MAX_WIDTH = 256
RS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEBUG_ENV = "VMAMBA2D_DEBUG_PLAN"
_printed: set = set()
_printed_lock = threading.Lock()


@dataclass(frozen=True)
class ScanCall:
    """What the rule reads of one scan call.

    dtype: the type of u, delta, B and C, or None when they differ; routes: the route codes
    (vmamba2d.ops.Route.code) the call scans; direction: "forward" or "backward"; grad: a
    forward that must save what the backward reads (a gradient will be taken).
    """

    nstate: int
    height: int
    width: int
    dtype: Optional[torch.dtype]
    routes: tuple[int, ...] = (0,)
    direction: str = "forward"
    grad: bool = False


@dataclass(frozen=True)
class Design:
    """The design a backend runs for a call (one of DESIGNS) and why."""

    name: str
    reason: str


def rs_max_width(backend: str, dtype: torch.dtype, routes: int = 1) -> int:
    """The widest map the backend's RS kernel takes: CUDA 32 lanes of 16 bytes (128 fp32 columns,
    256 fp16 / bf16), for several routes (the four-route kernel) rows_plan.cross_max_width (32 lanes of 4
    fp16 / bf16 or 2 fp32 columns: 128 / 64);
    Triton ``TRITON_RS_MAX_WIDTH`` (a row is one tile)."""
    if backend == "cuda":
        size = torch.empty((), dtype=dtype).element_size()
        return cross_max_width(size) if routes > 1 else WARP_LANES * 16 // size
    return TRITON_RS_MAX_WIDTH


def _streams(backend: str, route: int) -> bool:
    # CUDA RS streams every 2D route and the flat row-major ones; Triton RS the 2D routes 0-7.
    return route_streams_rows(route) if backend == "cuda" else 0 <= route < 8


def preferred(call: ScanCall, backend: str) -> list[tuple[str, str]]:
    """The designs the rule names for a call on ``backend``, best first, each with its reason."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if call.direction not in ("forward", "backward"):
        raise ValueError(f"direction: expected 'forward' or 'backward', got {call.direction!r}")
    if call.direction == "backward":
        return _backward(call, backend)
    if call.grad:
        return [("v3", "gradients needed: the v3 backward reads the v3 forward's tile carries")]
    if call.nstate != 1:
        return [("v3", f"N = {call.nstate}: PL and RS run d_state 1 only")]
    if call.dtype not in RS_DTYPES:
        return [("v3", f"inputs {call.dtype or 'of mixed types'}: PL and RS take one of fp32 / fp16 / bf16")]
    unstreamed = [r for r in call.routes if not _streams(backend, r)]
    if unstreamed:
        return [("v3", f"route {unstreamed[0]}: not a row stream of the {backend} RS kernel")]
    if backend == "cuda" and len(call.routes) > 1 and tuple(call.routes) != CROSS_ROUTE_CODES:
        return [("v3", f"routes {list(call.routes)}: the cuda four-route RS kernel runs the cross routes "
                       f"{list(CROSS_ROUTE_CODES)} only")]
    limit = rs_max_width(backend, call.dtype, len(call.routes))
    rs = [("rs", f"N = 1, width {call.width} <= {limit}")] if call.width <= limit else []
    cells = call.height * call.width
    pl = [("pl", f"L = {cells} <= {PL_MAX_CELLS}")] if cells <= PL_MAX_CELLS else []
    return pl + rs + [("v3", f"width {call.width} > {limit}" if not rs else "the fallback")]


def _backward(call: ScanCall, backend: str) -> list[tuple[str, str]]:
    if backend != "cuda":
        return [("v3", f"backward: {backend} has only the v3 backward")]
    if call.nstate != 1:
        return [("v3", f"backward at N = {call.nstate}: the RS backward runs d_state 1 only")]
    if call.dtype not in RS_DTYPES:
        return [("v3", f"backward with inputs {call.dtype or 'of mixed types'}: the RS backward takes one of "
                       "fp32 / fp16 / bf16")]
    flat = [r for r in call.routes if not 0 <= r < 8]
    if flat:
        return [("v3", f"backward along route {flat[0]}: the RS backward runs 2D routes (codes 0-7)")]
    if call.width > RS_BACKWARD_MAX_WIDTH:
        return [("v3", f"backward at width {call.width} > {RS_BACKWARD_MAX_WIDTH}: wider than the RS backward's "
                       "32 lanes of 4 columns")]
    return [("rs", f"backward at N = 1, 2D routes, width {call.width} <= {RS_BACKWARD_MAX_WIDTH}"),
            ("v3", "the fallback")]


def backward_pin() -> str:
    """The VMAMBA2D_SCAN_BACKWARD setting: "v3" (unset: the default until a GPU run has measured the
    RS backward against v3) or "auto" (the rule's design).

    Raises:
        ValueError: any other value.
    """
    return env_choice(BACKWARD_ENV, BACKWARD_CHOICES, "v3")


def choose_design(call: ScanCall, backend: str, built: Collection[str]) -> Design:
    """The design ``backend`` runs for ``call``: the rule's first design in ``built`` (the designs
    the backend has kernels for; "v3" always), the ones passed over named in the reason."""
    if "v3" not in built:
        raise ValueError(f"built: every backend has v3, got {sorted(built)}")
    skipped = []
    for name, why in preferred(call, backend):
        if name in built:
            reason = "; ".join(skipped + [f"{name.upper()}: {why}"])
            design = Design(name, reason)
            _debug_print(call, backend, design)
            return design
        skipped.append(f"{name.upper()} ({why}): not built for {backend}")
    raise AssertionError("the rule always ends in v3")


def _debug_print(call: ScanCall, backend: str, design: Design) -> None:
    if os.environ.get(DEBUG_ENV, "") not in ("1", "true", "yes"):
        return
    key = (call, backend, design)
    with _printed_lock:
        if key in _printed:
            return
        _printed.add(key)
    dtype = str(call.dtype).replace("torch.", "") if call.dtype is not None else "mixed"
    print(f"vmamba2d plan: {backend} {call.direction} N={call.nstate} {call.height}x{call.width} {dtype} "
          f"routes={list(call.routes)}{' grad' if call.grad else ''} -> {design.name} ({design.reason})",
          file=sys.stderr)


def debug_note(key: tuple, line: str) -> None:
    """Prints ``line`` once per ``key`` where DEBUG_ENV is set (a launcher's decision after the design,
    e.g. whether the four-route kernel folds the step sizes)."""
    if os.environ.get(DEBUG_ENV, "") not in ("1", "true", "yes"):
        return
    with _printed_lock:
        if key in _printed:
            return
        _printed.add(key)
    print(f"vmamba2d plan: {line}", file=sys.stderr)


def describe() -> dict:
    """The rule and the designs each path has, for ``backend_info()``."""
    return {"rule": "backward (CUDA, N = 1, fp32 / fp16 / bf16, 2D routes, W <= 128): RS; "
                    "other backward / gradient / N != 1 / other input types / a route RS does not stream: v3; "
                    f"L <= {PL_MAX_CELLS}: PL; W <= the backend's RS width (CUDA 32 lanes x 16 bytes, "
                    f"Triton {TRITON_RS_MAX_WIDTH}): RS; else v3 (a design without a kernel falls to the next)",
            "built": {path: list(designs) for path, designs in BUILT.items()},
            "cuda_four_route_fold": "with the step-size projection the NVRTC four-route RS kernel projects the "
                                    "low-rank step sizes itself where rows_plan.fold_rule estimates it pays (its "
                                    "added SASS within the issue time of the projection pass's bytes), else they "
                                    "are projected first; the plan's reason says which",
            "cuda_four_route_lanes": describe_cross(),
            "cuda_four_route_backward": f"{BACKWARD_ENV}=auto takes the rule's design (RS route passes where "
                                        "row 0 holds); unset or v3 keeps the v3 backward until a GPU run has "
                                        "measured RS against it",
            "backward_pin": os.environ.get(BACKWARD_ENV) or None,
            "debug_env": DEBUG_ENV}
