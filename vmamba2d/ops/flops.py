"""FLOP counting for the 2D selective-scan custom op with fvcore.

fvcore traces models with ``torch.jit.trace``; the compiled scan shows up as a node named after its
custom op (``vmamba2d::selective_scan_2d_fwd`` for the compiled kernels,
``vmamba2d::selective_scan_2d_triton_fwd`` for Triton; both share one schema and one handle;
``vmamba2d::cross_selective_scan_2d_fwd`` / ``..._triton_fwd`` for the four-route op). Register the handles with
``FlopCountAnalysis(model, inputs).set_op_handle(**FVCORE_OP_HANDLES)``, or
``set_op_handle(name, handle)`` for each item.

Convention (docs/scan.md, one multiply-add = one flop): a 2D scan counts 15 * B * L * D * N,
a 1D scan (a 1 x L or L x 1 map: the op used as Mamba's scan) 9 * B * L * D * N; either plus
B * D * L for the ``D * u`` skip term when ``D`` is given.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from .compiled.cross_ops import CROSS_FWD_OP_NAME
from .compiled.ops import FWD_OP_NAME
from .routes import Route
from .triton.cross_ops import CROSS_FWD_OP_NAME as TRITON_CROSS_FWD_OP_NAME
from .triton.ops import FWD_OP_NAME as TRITON_FWD_OP_NAME

# Argument positions in the op's schema (u, delta, A, B, C, D, delta_bias, delta_softplus, height,
# width, out_fp32).
_U, _A, _D, _HEIGHT, _WIDTH = 0, 2, 5, 8, 9


def scan_2d_flops(batch: int, dim: int, length: int, nstate: int, with_d: bool) -> int:
    """FLOPs of one 2D selective scan over u (batch, dim, length) with ``nstate`` states."""
    return 15 * batch * length * dim * nstate + (batch * dim * length if with_d else 0)


def scan_1d_flops(batch: int, dim: int, length: int, nstate: int, with_d: bool) -> int:
    """FLOPs of one 1D selective scan over u (batch, dim, length) with ``nstate`` states."""
    return 9 * batch * length * dim * nstate + (batch * dim * length if with_d else 0)


def _tensor_sizes(value: Any) -> Optional[list[int]]:
    """Static sizes of a traced tensor value, or None when it is not a tensor of known shape."""
    value_type = value.type()
    if value_type.kind() != "TensorType":
        return None
    return value_type.sizes()


def selective_scan_2d_flop_jit(inputs: list, outputs: list) -> int:
    """fvcore op handle for ``vmamba2d::selective_scan_2d_fwd``: the flops of one node.

    ``inputs`` are the node's traced argument values in schema order: u (batch, dim, L), A (dim, N),
    D (dim,) or None, and the constants height and width (a map with a side of 1 is a 1D scan).
    """
    u_sizes = _tensor_sizes(inputs[_U])
    a_sizes = _tensor_sizes(inputs[_A])
    if u_sizes is None or a_sizes is None:
        raise ValueError(f"{FWD_OP_NAME}: the traced graph has no static shapes for u / A")
    height, width = inputs[_HEIGHT].toIValue(), inputs[_WIDTH].toIValue()
    if not isinstance(height, int) or not isinstance(width, int):
        raise ValueError(f"{FWD_OP_NAME}: height / width are not constants in the traced graph")
    batch, dim, length = u_sizes
    with_d = inputs[_D].type().kind() != "NoneType"
    count = scan_1d_flops if min(height, width) == 1 else scan_2d_flops
    return count(batch, dim, length, a_sizes[1], with_d)


# Argument positions in the four-route op's schema (u, delta, A, B, C, D, delta_bias,
# delta_softplus, routes, out_fp32, delta_proj_weight; the Triton op has no delta_proj_weight).
_CROSS_U, _CROSS_A, _CROSS_D, _CROSS_ROUTES, _CROSS_PROJ = 0, 2, 5, 8, 10


def _constant_int_list(value: Any) -> Optional[list]:
    """A traced int[] argument's value: a list constant, or a ListConstruct of constants."""
    constant = value.toIValue()
    if constant is not None:
        return list(constant)
    node = value.node()
    if node.kind() != "prim::ListConstruct":
        return None
    items = [item.toIValue() for item in node.inputs()]
    return items if all(isinstance(item, int) for item in items) else None


def cross_selective_scan_2d_flop_jit(inputs: list, outputs: list) -> int:
    """fvcore op handle for ``vmamba2d::cross_selective_scan_2d_fwd``: the flops of one node.

    The sum over its routes of what the single-route op counts for the same route: a 2D scan
    per 2D route, a 1D scan per flat route, each with its own ``D * u`` term when D is given;
    plus, with a step-size projection (K, dim, R), its batch * K * dim * R * H * W multiply-adds
    (what the batched matmul it replaces counts).
    ``inputs``: u (batch, dim, H, W), A (K * dim, N), D or None, the constant route codes,
    delta_proj_weight or None.
    """
    u_sizes = _tensor_sizes(inputs[_CROSS_U])
    a_sizes = _tensor_sizes(inputs[_CROSS_A])
    codes = _constant_int_list(inputs[_CROSS_ROUTES])
    if u_sizes is None or a_sizes is None or codes is None:
        raise ValueError(f"{CROSS_FWD_OP_NAME}: the traced graph has no static shapes for u / A or no constant routes")
    batch, dim, height, width = u_sizes
    with_d = inputs[_CROSS_D].type().kind() != "NoneType"
    scans = sum(
        (scan_1d_flops if Route.from_code(code).flat or min(height, width) == 1 else scan_2d_flops)(
            batch, dim, height * width, a_sizes[1], with_d
        )
        for code in codes
    )
    return scans + _projection_flops(inputs, batch, height * width)


def _projection_flops(inputs: list, batch: int, length: int) -> int:
    """Multiply-adds of the four-route op's step-size projection: batch * K * dim * R * L, or 0
    without one."""
    if len(inputs) <= _CROSS_PROJ or inputs[_CROSS_PROJ].type().kind() == "NoneType":
        return 0
    sizes = _tensor_sizes(inputs[_CROSS_PROJ])
    if sizes is None:
        raise ValueError(f"{CROSS_FWD_OP_NAME}: the traced graph has no static shape for delta_proj_weight")
    routes, dim, rank = sizes
    return batch * routes * dim * rank * length


FVCORE_OP_HANDLES: dict[str, Callable[[list, list], int]] = {
    FWD_OP_NAME: selective_scan_2d_flop_jit,
    TRITON_FWD_OP_NAME: selective_scan_2d_flop_jit,
    CROSS_FWD_OP_NAME: cross_selective_scan_2d_flop_jit,
    TRITON_CROSS_FWD_OP_NAME: cross_selective_scan_2d_flop_jit,
}
