"""ONNX translations of the scan custom ops, made of standard ONNX operators only.

``torch.onnx.export(..., dynamo=True)`` cannot look inside ``vmamba2d::selective_scan_2d_fwd`` or
``vmamba2d::cross_selective_scan_2d_fwd`` (they call the compiled kernel) nor their Triton
counterparts (``..._triton_fwd``), so :func:`translation_table` gives the exporter an onnxscript
function for each (``import vmamba2d`` registers them as the exporter's defaults,
:mod:`vmamba2d.export.onnx_registry`). The functions write
the scan with operators of the default ONNX domain (Transpose, Exp, Log, Mul, Add, MatMul,
Scan, Gather, ...), so onnxruntime, TensorRT and OpenVINO load the file without a plugin.

Lowering of one route (:mod:`vmamba2d.ops.routes` defines the routes), for every channel and state::

    dt = softplus(delta + delta_bias);  a = exp(dt * A);  x = dt * B * u     (discretise)
    first pass   hh = a * hh[previous cell along the first axis]  + x       (ONNX Scan)
    second pass  h  = a * h[previous cell along the second axis] + hh       (ONNX Scan)
                 (flat routes: h = hh + P * h[end of the previous line], P = running product of a)
    y = sum_n C * h

Why a sequential ``Scan`` and not a log-depth (doubling) scan built of Pad / Slice / Mul / Add:
both are exact products of decays in (0, 1] (no exp(-cumsum) trick, which overflows in fp32 for
long or fast-decaying lines), but the doubling scan re-reads the whole map log2(L) times. In
onnxruntime 1.32 on 2 CPU cores, both passes over four routes of 96 channels on a 56 x 56 map
(vmamba2d_tiny's first stage) took 21 ms (Scan) against 139 ms (doubling) at batch 1 and 0.57 s
against 2.9 s at batch 16. Each Scan iteration updates a whole
line of the map (all columns for a pass down the rows, with batch, channels and states), so the
loop runs H or W times, not H * W.

Layout: ONNX Scan is fastest over the leading axis (onnxruntime transposes the input itself for
any other axis, a general transpose that made the pass 3-7x slower at these shapes), so the maps
move to the map-major layout ``(H, W, batch, groups, channels)``, where a pass down the rows runs
as it is and a pass along the rows on the two leading axes swapped (a transpose of whole
contiguous rows). Only moves that keep the channels' axis innermost, or bring it there from the
map's own layout as ``(H, W)`` leading, are cheap in onnxruntime: putting W first straight from
the map layout gathers single values and took 15x as long at the first stage's maps, which is why
no map goes there directly. A route's direction is the Scan's ``scan_input_directions`` /
``scan_output_directions``, so reversed routes need no flipped copies.
"""
from __future__ import annotations

import functools
import itertools
from typing import Sequence

import numpy as np
import onnx.defs
import onnx_ir as ir
from onnxscript import opset18 as op
from onnxscript import values

from ..ops import Route

# Layouts. "map" is the op's own (batch, groups, channels, H, W). The routes compute in the
# map-major layout (H, W, batch, groups, channels[, N]): the step sizes, decays and inputs of
# every route are formed there, and a Scan over rows (along H) runs on it as it is; a pass along W
# runs on its leading-axes swap (W, H, ...). A route's output comes back from the layout of its
# second pass: (H, W, ...) for rows-first routes, (W, H, ...) for columns-first ones.
_MAP_TO_HW = [3, 4, 0, 1, 2]
_SECOND_PASS_TO_MAP = {False: [2, 3, 4, 0, 1], True: [2, 3, 4, 1, 0]}  # key: columns_first
_SWAP_LEADING = [1, 0, 2, 3, 4, 5]

_body_names = itertools.count()


def _body_value(name: str, dtype: ir.DataType, rank: int) -> ir.Value:
    # onnxruntime needs the rank of every subgraph value; the sizes stay symbolic.
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape([None] * rank))


def _named_output(node: ir.Node, name: str, dtype: ir.DataType, rank: int) -> ir.Value:
    out = node.outputs[0]
    out.name, out.type, out.shape = name, ir.TensorType(dtype), ir.Shape([None] * rank)
    return out


def _recurrence_body(dtype: ir.DataType, rank: int, with_product: bool) -> ir.Graph:
    """Scan body of ``h = a * h_prev + x`` on one line (rank ``rank``); with ``with_product`` it also
    carries ``p = a * p_prev`` (the running product of the decay, for flat routes).

    Inputs: states (h_prev[, p_prev]), then the scanned line's (a, x).
    Outputs: states (h[, p]), then the per-line outputs (h[, p]).
    """
    tag = f"vmamba2d_scan{next(_body_names)}"
    h_prev = _body_value(f"{tag}_h_prev", dtype, rank)
    states = [h_prev]
    if with_product:
        p_prev = _body_value(f"{tag}_p_prev", dtype, rank)
        states.append(p_prev)
    a = _body_value(f"{tag}_a", dtype, rank)
    x = _body_value(f"{tag}_x", dtype, rank)
    decayed = ir.Node("", "Mul", [a, h_prev])
    _named_output(decayed, f"{tag}_decayed", dtype, rank)
    h = ir.Node("", "Add", [decayed.outputs[0], x])
    nodes = [decayed, h]
    state_outs = [_named_output(h, f"{tag}_h", dtype, rank)]
    if with_product:
        p = ir.Node("", "Mul", [a, p_prev])
        nodes.append(p)
        state_outs.append(_named_output(p, f"{tag}_p", dtype, rank))
    # A Scan output cannot be the same value as a state output: copy each line out.
    copies = [ir.Node("", "Identity", [s]) for s in state_outs]
    nodes += copies
    line_outs = [_named_output(c, f"{s.name}_line", dtype, rank) for c, s in zip(copies, state_outs)]
    return ir.Graph(states + [a, x], state_outs + line_outs, nodes=nodes, name=tag)


def _carry_body(dtype: ir.DataType, rank: int, line_end: int) -> ir.Graph:
    """Scan body of a flat route's second pass, over lines of rank ``rank`` (line axis first):
    ``h = hh + p * carry`` and the next carry ``h[line_end]`` (the line's last visited cell).

    Inputs: carry (rank - 1), then the scanned line's (hh, p). Outputs: carry, h.
    """
    tag = f"vmamba2d_carry{next(_body_names)}"
    carry = _body_value(f"{tag}_carry_prev", dtype, rank - 1)
    hh = _body_value(f"{tag}_hh", dtype, rank)
    p = _body_value(f"{tag}_p", dtype, rank)
    carried = ir.Node("", "Mul", [p, carry])
    _named_output(carried, f"{tag}_carried", dtype, rank)
    h = ir.Node("", "Add", [hh, carried.outputs[0]])
    h_out = _named_output(h, f"{tag}_h", dtype, rank)
    index = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(np.array(line_end, dtype=np.int64)))])
    _named_output(index, f"{tag}_end", ir.DataType.INT64, 0)
    end = ir.Node("", "Gather", [h_out, index.outputs[0]], attributes=[ir.AttrInt64("axis", 0)])
    carry_out = _named_output(end, f"{tag}_carry", dtype, rank - 1)
    return ir.Graph([carry, hh, p], [carry_out, h_out], nodes=[carried, h, index, end], name=tag)


@functools.lru_cache(maxsize=None)
def _scan_op(num_outputs: int) -> values.Op:
    """ONNX ``Scan`` with a fixed number of outputs.

    Scan's outputs are one variadic parameter, and the exporter's tracer gives a variadic output
    one value; this schema lists them one by one (same operator, domain, version, inputs and
    attributes), so the traced node gets all of its outputs.
    """
    scan = onnx.defs.get_schema("Scan", op.version)
    schema = onnx.defs.OpSchema(
        scan.name, scan.domain, scan.since_version, "",
        inputs=list(scan.inputs),
        outputs=[onnx.defs.OpSchema.FormalParameter(f"output_{i}", "V") for i in range(num_outputs)],
        type_constraints=[(c.type_param_str, list(c.allowed_type_strs), "") for c in scan.type_constraints],
        attributes=list(scan.attributes.values()),
    )
    return values.Op(op, "Scan", schema)


def _filled_like_line(line_source, value: float):
    """A tensor of ``value`` shaped like ``line_source`` without its leading axis (a Scan state)."""
    filled = op.ConstantOfShape(op.Shape(line_source, start=1), value=ir.tensor(np.array([0.0], dtype=np.float32)))
    filled = op.CastLike(filled, line_source)
    if value != 0.0:
        filled = op.Add(filled, op.CastLike(op.Constant(value_float=value), line_source))
    return filled


# Significand bits per dtype: where _softplus stops evaluating log(1 + exp(z)).
_SIGNIFICAND_BITS = {ir.DataType.FLOAT: 24, ir.DataType.DOUBLE: 53, ir.DataType.FLOAT16: 11, ir.DataType.BFLOAT16: 8}


def _softplus(z, dtype: ir.DataType):
    """softplus(z) = log(1 + exp(z)), written with elementwise operators onnxruntime vectorises.

    onnxruntime's Softplus runs 1.6-2x slower than the nine passes below ((16, 96, 56, 56) fp32,
    2 threads); the plain Log(1 + Exp(z)) loses the relative precision of small steps (z << 0:
    7e-5 at z = -7), because 1 + t rounds. Here t = exp(min(z, c)), u = 1 + t rounded, and
    log(1 + t) = log(u) - ((u - 1) - t) / u to first order in the rounding (u - 1 and the
    difference are exact while t < 2^(bits - 1)); above c, softplus(z) = z to within the dtype's
    precision, taken by the Max. Max relative error in fp32 over the normal range 3.1e-7, the same
    as onnxruntime's Softplus; NaN and infinities as Softplus.
    """
    bound = (_SIGNIFICAND_BITS[dtype] - 1) * float(np.log(2.0))
    one = op.CastLike(op.Constant(value_float=1.0), z)
    t = op.Exp(op.Min(z, op.CastLike(op.Constant(value_float=bound), z)))
    u = op.Add(t, one)
    rounding = op.Div(op.Sub(op.Sub(u, one), t), u)
    return op.Max(op.Sub(op.Log(u), rounding), z)


def _direction(reverse: bool) -> int:
    return 1 if reverse else 0


def scan_route(u_hw, delta_hw, A, B_hw, C_hw, delta_bias, delta_softplus: bool, route: Route,
               dtype: ir.DataType, nstate: int):
    """One route's scan output, without the ``D * u`` skip term, in the layout of its second pass
    (:func:`to_map` returns it to map order; routes of one pass order share it, so their outputs
    can be summed before that transpose).

    Args (onnxscript values, map-major layout, :func:`map_major`):
        u_hw, delta_hw: (H, W, batch, groups, channels).
        A: (groups, channels, N) decay rates; delta_bias: (groups, channels) or None.
        B_hw, C_hw: (H, W, batch, groups, N) projections, shared by a group's channels.
        nstate: N (static).
    Returns: y (H, W, batch, groups, channels) for a rows-first route, (W, H, ...) for a
    columns-first one.
    """
    cols_first = route.columns_first
    dt = delta_hw if delta_bias is None else op.Add(delta_hw, delta_bias)
    if delta_softplus:
        dt = _softplus(dt, dtype)
    axis_n = op.Constant(value_ints=[-1])
    decay = op.Exp(op.Mul(op.Unsqueeze(dt, axis_n), A))  # (H, W, batch, groups, channels, N)
    b_hw = op.Unsqueeze(B_hw, op.Constant(value_ints=[4]))  # (H, W, batch, groups, 1, N)
    x = op.Mul(op.Unsqueeze(op.Mul(dt, u_hw), axis_n), b_hw)

    # The first pass runs along W (rows first) on the swapped layout, along H as it is.
    decay_first, x_first = (decay, x) if cols_first else (op.Transpose(t, perm=_SWAP_LEADING) for t in (decay, x))
    reverse_first = route.from_bottom if cols_first else route.from_right
    reverse_second = route.from_right if cols_first else route.from_bottom
    line_rank = 5
    if route.flat:
        first = _scan_op(4)(
            _filled_like_line(x_first, 0.0), _filled_like_line(x_first, 1.0), decay_first, x_first,
            body=_recurrence_body(dtype, line_rank, with_product=True),
            num_scan_inputs=2,
            scan_input_directions=[_direction(reverse_first)] * 2,
            scan_output_directions=[_direction(reverse_first)] * 2,
        )
        hh, product = (op.Transpose(t, perm=_SWAP_LEADING) for t in first[2:])
        second = _scan_op(2)(
            _filled_like_line(_filled_like_line(hh, 0.0), 0.0), hh, product,
            body=_carry_body(dtype, line_rank, line_end=0 if reverse_first else -1),
            num_scan_inputs=2,
            scan_input_directions=[_direction(reverse_second)] * 2,
            scan_output_directions=[_direction(reverse_second)],
        )
    else:
        first = _scan_op(2)(
            _filled_like_line(x_first, 0.0), decay_first, x_first,
            body=_recurrence_body(dtype, line_rank, with_product=False),
            num_scan_inputs=2,
            scan_input_directions=[_direction(reverse_first)] * 2,
            scan_output_directions=[_direction(reverse_first)],
        )
        hh = op.Transpose(first[1], perm=_SWAP_LEADING)
        decay_second = op.Transpose(decay, perm=_SWAP_LEADING) if cols_first else decay
        second = _scan_op(2)(
            _filled_like_line(hh, 0.0), decay_second, hh,
            body=_recurrence_body(dtype, line_rank, with_product=False),
            num_scan_inputs=2,
            scan_input_directions=[_direction(reverse_second)] * 2,
            scan_output_directions=[_direction(reverse_second)],
        )
    h = second[1]  # (S2, S1, batch, groups, channels, N), S2 the second pass's axis
    c_second = op.Transpose(C_hw, perm=_SWAP_LEADING[:5]) if cols_first else C_hw
    readout = op.Mul(h, op.Unsqueeze(c_second, op.Constant(value_ints=[4])))
    # One state (the models' N = 1): dropping the axis is the sum, without ReduceSum's pass.
    return op.Squeeze(readout, axis_n) if nstate == 1 else op.ReduceSum(readout, axis_n, keepdims=0)


def map_major(map_values):
    """A map (batch, groups, channels or N, H, W) in the map-major layout (H, W, batch, groups, ...)."""
    return op.Transpose(map_values, perm=_MAP_TO_HW)


def to_map(y_second, columns_first: bool):
    """A route output of :func:`scan_route` as (batch, groups, channels, H, W)."""
    return op.Transpose(y_second, perm=_SECOND_PASS_TO_MAP[columns_first])


def _onnx_dtype(value) -> ir.DataType:
    if value.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        raise TypeError(f"the ONNX scan takes floating-point u, got {value.dtype}")
    return value.dtype


def _static_dim(value, axis: int, what: str) -> int:
    dim = value.shape[axis]
    if not isinstance(dim, int):
        raise ValueError(f"exporting the scan needs a static {what} (axis {axis} of {value.name}), got {dim}")
    return dim


def _projected_deltas(delta_low, weight, num_routes: int, dim: int) -> list:
    """Each route's full-rank step sizes in the map-major layout (H, W, batch, 1, dim), from the
    low-rank (batch, K, R, H, W) and weight (K, dim, R).

    One batched MatMul with the channels last, (batch, K, H * W, dim), so the move to the
    map-major layout copies whole channel rows (onnxruntime's Einsum for the same sum, into
    channels-first maps, took 6x the MatMul's time).
    """
    low = op.Transpose(op.Reshape(delta_low, op.Constant(value_ints=[0, 0, 0, -1])), perm=[0, 1, 3, 2])
    rows = op.Unsqueeze(op.Transpose(op.CastLike(weight, delta_low), perm=[0, 2, 1]), op.Constant(value_ints=[0]))
    full = op.MatMul(low, rows)  # (batch, K, H * W, dim)
    sizes = op.Concat(op.Shape(delta_low, end=2), op.Shape(delta_low, start=3), op.Constant(value_ints=[dim]), axis=0)
    full = op.Reshape(full, sizes)  # (batch, K, H, W, dim)
    parts = op.Split(full, axis=1, num_outputs=num_routes) if num_routes > 1 else [full]
    return [op.Transpose(part, perm=[2, 3, 0, 1, 4]) for part in parts]


def cross_selective_scan_2d_onnx(
    u, delta, A, B, C, D, delta_bias, delta_softplus: bool, routes: Sequence[int], out_fp32: bool,
    delta_proj_weight=None,
):
    """ONNX translation of ``vmamba2d::cross_selective_scan_2d_fwd``.

    u (batch, Di, H, W); delta (batch, K, Di, H, W), or the low-rank (batch, K, R, H, W) with
    delta_proj_weight (K, Di, R) (projected by a MatMul first); A (K * Di, N); B, C
    (batch, K, N, H, W); D, delta_bias (K * Di,) or None. Returns y (batch, Di, H, W): the route
    outputs summed in route order, plus ``D * u`` summed over the routes' D.
    """
    dtype = _onnx_dtype(u)
    route_list = [Route.from_code(int(code)) for code in routes]
    num_routes = len(route_list)
    dim = _static_dim(u, 1, "channel count")
    if delta_proj_weight is not None:
        deltas_hw = _projected_deltas(delta, delta_proj_weight, num_routes, dim)
    else:
        deltas = op.Split(delta, axis=1, num_outputs=num_routes) if num_routes > 1 else [delta]
        deltas_hw = [map_major(d) for d in deltas]
    nstate = _static_dim(A, 1, "state count")
    u_hw = map_major(op.Unsqueeze(u, op.Constant(value_ints=[1])))  # (H, W, batch, 1, Di)
    A_routes = op.Reshape(A, op.Constant(value_ints=[num_routes, 1, dim, nstate]))
    bias_routes = None if delta_bias is None else op.Reshape(delta_bias, op.Constant(value_ints=[num_routes, 1, dim]))
    Bs = op.Split(map_major(B), axis=3, num_outputs=num_routes) if num_routes > 1 else [map_major(B)]
    Cs = op.Split(map_major(C), axis=3, num_outputs=num_routes) if num_routes > 1 else [map_major(C)]
    # The outputs of the routes of one pass order (rows first / columns first) share a layout:
    # summed there in route order, then moved back to the map once.
    y_second = {}
    for k, route in enumerate(route_list):
        pick = op.Constant(value_ints=[k])
        y_route = scan_route(
            u_hw, deltas_hw[k],
            op.Squeeze(op.Gather(A_routes, pick, axis=0), op.Constant(value_ints=[0])),
            Bs[k], Cs[k],
            None if bias_routes is None else op.Squeeze(op.Gather(bias_routes, pick, axis=0), op.Constant(value_ints=[0])),
            delta_softplus, route, dtype, nstate,
        )
        order = route.columns_first
        y_second[order] = op.Add(y_second[order], y_route) if order in y_second else y_route
    y = None
    for order, y_order in y_second.items():
        y = to_map(y_order, order) if y is None else op.Add(y, to_map(y_order, order))
    y = op.Squeeze(y, op.Constant(value_ints=[1]))
    if D is not None:
        D_total = op.ReduceSum(op.Reshape(D, op.Constant(value_ints=[num_routes, dim])), op.Constant(value_ints=[0]), keepdims=0)
        y = op.Add(y, op.Mul(op.Unsqueeze(D_total, op.Constant(value_ints=[1, 2])), u))
    return op.Cast(y, to=ir.DataType.FLOAT) if out_fp32 else y


def _dims_tensor(*dims):
    """A 1-D int64 shape from ints and (traced) scalar sizes."""
    if all(isinstance(d, int) for d in dims):
        return op.Constant(value_ints=list(dims))
    parts = [op.Constant(value_ints=[d]) if isinstance(d, int) else op.Reshape(op.Cast(d, to=ir.DataType.INT64), op.Constant(value_ints=[1]))
             for d in dims]
    return op.Concat(*parts, axis=0)


def selective_scan_2d_onnx(
    u, delta, A, B, C, D, delta_bias, delta_softplus: bool, height, width, out_fp32: bool,
    save_carries: bool = False,
):
    """ONNX translation of ``vmamba2d::selective_scan_2d_fwd`` (the single-route 2D scan).

    u, delta (batch, dim, L); A (dim, N); B, C (batch, groups, N, L); D, delta_bias (dim,) or
    None; L = height * width, row-major. Returns (y (batch, dim, L), carry_h, carry_v) with the
    carries empty: they only feed the CUDA kernel's backward.
    """
    dtype = _onnx_dtype(u)
    groups = _static_dim(B, 1, "group count")
    nstate = _static_dim(A, 1, "state count")
    as_map = _dims_tensor(0, groups, -1, height, width)  # Reshape's 0 keeps the batch size
    route = Route()
    y = scan_route(
        map_major(op.Reshape(u, as_map)), map_major(op.Reshape(delta, as_map)),
        op.Reshape(A, op.Constant(value_ints=[groups, -1, nstate])),
        map_major(op.Reshape(B, _dims_tensor(0, groups, nstate, height, width))),
        map_major(op.Reshape(C, _dims_tensor(0, groups, nstate, height, width))),
        None if delta_bias is None else op.Reshape(delta_bias, op.Constant(value_ints=[groups, -1])),
        delta_softplus, route, dtype, nstate,
    )
    y = op.Reshape(to_map(y, route.columns_first), op.Shape(u))
    if D is not None:
        y = op.Add(y, op.Mul(op.Unsqueeze(D, op.Constant(value_ints=[1])), u))
    if out_fp32:
        y = op.Cast(y, to=ir.DataType.FLOAT)
    return (y, *_no_carries())


def _no_carries():
    """Two empty carry outputs: the kernels' carries only feed their backward."""
    no_carry = op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.float32)))
    return no_carry, op.Identity(no_carry)


def cross_selective_scan_2d_triton_onnx(
    u, delta, A, B, C, D, delta_bias, delta_softplus: bool, routes: Sequence[int], out_fp32: bool,
    save_carries: bool = False,
):
    """ONNX translation of ``vmamba2d::cross_selective_scan_2d_triton_fwd`` (the four-route op's
    Triton kernel, run where the CUDA kernel cannot): (y, vcarry, hcarry), y as
    :func:`cross_selective_scan_2d_onnx`, the carries empty."""
    y = cross_selective_scan_2d_onnx(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32)
    return (y, *_no_carries())


def translation_table() -> dict:
    """``custom_translation_table`` for :func:`torch.onnx.export` (dynamo=True): every scan custom
    op the models call (compiled CPU / CUDA kernels and Triton kernels), mapped to its ONNX
    translation."""
    import torch

    from .. import ops  # noqa: F401  (importing the ops registers the custom ops)

    return {
        torch.ops.vmamba2d.cross_selective_scan_2d_fwd.default: cross_selective_scan_2d_onnx,
        torch.ops.vmamba2d.selective_scan_2d_fwd.default: selective_scan_2d_onnx,
        torch.ops.vmamba2d.cross_selective_scan_2d_triton_fwd.default: cross_selective_scan_2d_triton_onnx,
        # same schema as the compiled single-route op
        torch.ops.vmamba2d.selective_scan_2d_triton_fwd.default: selective_scan_2d_onnx,
    }
