"""The rule that picks the Triton forward of the single-route op, and the launch of the
row-streaming kernel (RS, :mod:`vmamba2d.ops.triton.rows`, imported with triton on first use).

Rule (``forward_design``): :mod:`vmamba2d.ops.plan`'s rule for route 0 among the designs Triton
has (``BUILT``: RS, which this module calls ``"rows"``, and v3, the tiled kernels of
:mod:`~vmamba2d.ops.triton.kernels`, ``"tiles"``): rows when N (d_state) == 1, W <=
``MAX_ROWS_WIDTH``, the scan inputs are fp32 / fp16 / bf16, and the forward need not save tile
carries (no gradient is taken: the backward kernel rebuilds its states from the tiled forward's
carries, which RS does not write); tiles otherwise.

``VMAMBA2D_TRITON_PLAN`` pins it: ``tiles`` always takes the tiled kernels, ``rows`` takes RS and
raises where RS cannot run the call, ``auto`` (or unset) applies the rule. Each new decision is
logged at DEBUG level on the ``vmamba2d.ops.triton`` logger; ``backend_info()["triton_forward"]``
states the rule and the pin.

Tuning: on CUDA tensors :mod:`vmamba2d.ops.tuning` (the CUDA RS kernel's tuner: the same key, disk
cache, capture / compile skip, ``VMAMBA2D_TUNE`` pin and DDP rule; ``triton.autotune`` has none of
these and times many calls) picks among ``tuning_configs``: warps per program (``num_warps``) and
channels per program (``BLOCK_M``), tied so that every candidate keeps the same elements per
thread and at least ``BLOCK_W / 32`` warps. Triton then lays a row out over the same lanes and
warps in every candidate, so ``tl.associative_scan`` combines a row in the same order and no output
bit depends on the choice (tests/ops/triton/test_scan_triton_rows.py compiles every candidate for sm_90 and
compares the scan's layout). Under the interpreter the first candidate runs untimed.
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional, Tuple

import torch

from .. import plan as scan_plan
from .. import tuning
from ..settings import env_choice

Tensor = torch.Tensor

PLAN_ENV_VAR = "VMAMBA2D_TRITON_PLAN"
PLAN_CHOICES = ("auto", "rows", "tiles")
MAX_ROWS_WIDTH = scan_plan.TRITON_RS_MAX_WIDTH
ROWS_MODULE = "vmamba2d.ops.triton.rows"
BUILT = scan_plan.BUILT["triton single-route"]  # the designs this path launches (vmamba2d.ops.plan.DESIGNS)
TUNED_KERNEL = "triton-rs"
# Elements of each [BLOCK_M, BLOCK_W] tile per thread in every tuning candidate.
ELEMENTS_PER_THREAD = 2
MAX_WARPS = 8

_log = logging.getLogger("vmamba2d.ops.triton")
_logged: set = set()


def block_width(width: int) -> int:
    """The power of two >= ``width`` a row tile spans."""
    return 1 << max(0, (width - 1).bit_length())


def tuning_configs(block_w: int) -> List[Tuple[int, int]]:
    """(BLOCK_M, num_warps) candidates for rows ``block_w`` wide, the untuned default first: warps
    w >= block_w / 32 (up to ``MAX_WARPS``) and BLOCK_M = ELEMENTS_PER_THREAD * 32 * w / block_w."""
    configs = []
    for warps in (4, 1, 2, 8):
        if warps * 32 < block_w or warps > MAX_WARPS:
            continue
        configs.append((ELEMENTS_PER_THREAD * 32 * warps // block_w, warps))
    if not configs:  # only reached for block_w > 32 * MAX_WARPS, which the rule excludes
        raise ValueError(f"no row-streaming configuration for rows {block_w} wide")
    return configs


def _pinned() -> str:
    return env_choice(PLAN_ENV_VAR, PLAN_CHOICES, "auto")


def rows_problem(nstate: int, height: int, width: int, dtype: torch.dtype, save_carries: bool) -> Optional[str]:
    """Why the rule does not give the row-streaming kernel a call (None when it does)."""
    call = scan_plan.ScanCall(nstate, height, width, dtype, (0,), "forward", save_carries)
    design = scan_plan.choose_design(call, "triton", BUILT)
    return None if design.name == "rs" else design.reason


def forward_design(nstate: int, height: int, width: int, dtype: torch.dtype, save_carries: bool) -> str:
    """``"rows"`` or ``"tiles"``: the Triton forward that runs a single-route call (rule above)."""
    pin = _pinned()
    problem = rows_problem(nstate, height, width, dtype, save_carries)
    if pin == "rows" and problem is not None:
        raise ValueError(f"{PLAN_ENV_VAR}=rows but the row-streaming kernel cannot run this call: {problem}")
    design = "tiles" if pin == "tiles" or problem is not None else "rows"
    key = (design, nstate, height, width, dtype, save_carries)
    if key not in _logged and _log.isEnabledFor(logging.DEBUG):
        _logged.add(key)
        _log.debug("triton forward %s for N=%d %dx%d %s%s (%s)", design, nstate, height, width, dtype,
                   " with carries" if save_carries else "", problem or f"{PLAN_ENV_VAR}={pin}")
    return design


def describe() -> dict:
    """The rule and the pin, for ``backend_info()``."""
    return {"rule": f"rows (row-streaming) for d_state 1, width <= {MAX_ROWS_WIDTH}, fp32/fp16/bf16, "
                    "no gradient; else tiles",
            "pin": os.environ.get(PLAN_ENV_VAR) or None}


def launch_rows_forward(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                        delta_bias: Optional[Tensor], delta_softplus: bool, out_fp32: bool,
                        param_groups: int, route: int = 0, tuner: Optional[tuning.Tuner] = None) -> Tensor:
    """Run the row-streaming kernel: y (maps, chans, H, W), fp32 if ``out_fp32`` else u's dtype,
    scanned along the 2D route with code ``route`` (0-7; the scanned lines -- rows, or columns
    for columns-first codes -- at most ``MAX_ROWS_WIDTH`` long).

    Inputs contiguous, validated, N = 1: u (maps, chans, H, W); delta (maps, 1, chans, H, W); A
    (param_groups * chans, 1); B / C (maps, 1, 1, H, W); D / delta_bias (param_groups * chans,) or
    None; map m reads the parameter rows of group m % param_groups. ``BLOCK_M`` and ``num_warps``:
    ``tuner``'s pick among ``tuning_configs`` (tuning.default_tuner() for CUDA tensors, compiled);
    the first config under the interpreter unless a tuner is given.
    """
    import importlib

    from triton.runtime.interpreter import InterpretedFunction

    rows = importlib.import_module(ROWS_MODULE)
    maps, chans, height, width = u.shape
    y = torch.empty(u.shape, device=u.device, dtype=torch.float32 if out_fp32 else u.dtype)
    if u.numel() == 0:
        return y
    if not 0 <= route < 8:
        raise ValueError(f"route must be a 2D route code in [0, 8), got {route}")
    line_len = height if route & 4 else width
    if line_len > MAX_ROWS_WIDTH:
        raise ValueError(f"the row-streaming kernel scans lines up to {MAX_ROWS_WIDTH} long, got {line_len}")
    block_w = block_width(line_len)
    args = (u, delta, A, B, C, D if D is not None else A, delta_bias if delta_bias is not None else A, y,
            chans, param_groups, height, width)
    flags = dict(HAS_D=D is not None, HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus),
                 ROUTE=route, BLOCK_W=block_w)
    def run(knobs) -> None:
        block_m = knobs["block_m"]
        rows.rows_fwd_kernel[(maps, -(-chans // block_m))](*args, **flags, BLOCK_M=block_m, num_warps=knobs["warps"])

    candidates = [{"block_m": m, "warps": w} for m, w in tuning_configs(block_w)]
    if tuner is not None or (u.is_cuda and not isinstance(rows.rows_fwd_kernel, InterpretedFunction)):
        key = _tuning_key(u, y, param_groups, route, delta_softplus, D is not None, delta_bias is not None)
        knobs = (tuner or tuning.default_tuner()).choose(TUNED_KERNEL, key, candidates, run).knobs
    else:
        knobs = candidates[0]
    run(knobs)
    return y


def _tuning_key(u: Tensor, y: Tensor, param_groups: int, route: int, softplus: bool, has_d: bool,
                has_bias: bool) -> dict:
    # GPU name and SM count (the device type and 0 off a GPU), types, shape, N, route, direction.
    gpu, sms = u.device.type, 0
    if u.is_cuda:
        properties = torch.cuda.get_device_properties(u.device)
        gpu, sms = properties.name, properties.multi_processor_count
    maps, chans, height, width = u.shape
    return {"gpu": gpu, "sms": sms, "dtype": str(u.dtype).replace("torch.", ""),
            "y": str(y.dtype).replace("torch.", ""), "maps": maps, "chans": chans, "groups": param_groups, "nstate": 1, "height": height, "width": width,
            "routes": [route], "direction": "forward", "softplus": bool(softplus), "has_d": has_d, "has_bias": has_bias}
