"""ONNX translations of the scan custom ops, made of standard ONNX operators only.

``torch.onnx.export(..., dynamo=True)`` cannot look inside ``vmamba2d::selective_scan_2d_fwd`` or
``vmamba2d::cross_selective_scan_2d_fwd`` (they call the compiled kernel) nor their Triton
counterparts (``..._triton_fwd``), so :func:`translation_table` gives the exporter an onnxscript
function for each (``import vmamba2d`` registers them as the exporter's defaults,
:mod:`vmamba2d.export.onnx_registry`). The functions write
the scan with operators of the default ONNX domain (Transpose, Softplus, Exp, Mul, Add, ReduceSum,
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
any other axis, a general transpose that made the pass 3-7x slower at these shapes), so each route
moves its inputs to a spatial-major layout with the first pass's axis leading, ``(S1, S2, batch,
groups, channels)``, and swaps the two leading axes (a block transpose) between the passes. A
route's direction is the Scan's ``scan_input_directions`` / ``scan_output_directions``, so
reversed routes need no flipped copies.
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

from ..ops.routes import Route

# Layouts of a route's maps. "map" is the op's own (batch, groups, channels, H, W); L1 puts the
# first pass's axis first, L2 the second pass's. Rows-first routes (and row-major flat routes) run
# their first pass along W, columns-first routes along H.
_MAP_TO_L1 = {False: [4, 3, 0, 1, 2], True: [3, 4, 0, 1, 2]}  # key: columns_first
_MAP_TO_L2 = {False: [3, 4, 0, 1, 2], True: [4, 3, 0, 1, 2]}
_L2_TO_MAP = {False: [2, 3, 4, 0, 1], True: [2, 3, 4, 1, 0]}
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


def _direction(reverse: bool) -> int:
    return 1 if reverse else 0


def scan_route(u_l1, delta_l1, A, B, C, delta_bias, delta_softplus: bool, route: Route, dtype: ir.DataType,
               nstate: int):
    """One route's scan output, without the ``D * u`` skip term, in the route's second-pass layout
    (:func:`to_map` returns it to map order; routes of one pass order share it, so their outputs
    can be summed before that transpose).

    Args (onnxscript values):
        u_l1: u in the route's first-pass layout (S1, S2, batch, groups, channels)
            (:func:`first_pass_layout`, shared by the routes of one pass order).
        delta_l1: the route's step sizes in the same layout.
        A: (groups, channels, N) decay rates; delta_bias: (groups, channels) or None.
        B, C: (batch, groups, N, H, W) projections, shared by a group's channels.
        nstate: N (static).
    Returns: y (S2, S1, batch, groups, channels).
    """
    cols_first = route.columns_first
    to_l1 = _MAP_TO_L1[cols_first]
    dt = delta_l1  # (S1, S2, batch, groups, channels)
    if delta_bias is not None:
        dt = op.Add(dt, delta_bias)
    if delta_softplus:
        # ONNX Softplus, although onnxruntime runs it ~3x slower than Exp-Add-Log: log(1 + exp(x))
        # written out loses dt's relative precision for small steps (x << 0; 7e-5 at x = -7).
        dt = op.Softplus(dt)
    axis_n = op.Constant(value_ints=[-1])
    decay = op.Exp(op.Mul(op.Unsqueeze(dt, axis_n), A))  # (S1, S2, batch, groups, channels, N)
    b_l1 = op.Unsqueeze(op.Transpose(B, perm=to_l1), op.Constant(value_ints=[4]))  # (S1, S2, batch, groups, 1, N)
    x = op.Mul(op.Unsqueeze(op.Mul(dt, u_l1), axis_n), b_l1)

    reverse_first = route.from_bottom if cols_first else route.from_right
    reverse_second = route.from_right if cols_first else route.from_bottom
    line_rank = 5
    if route.flat:
        first = _scan_op(4)(
            _filled_like_line(x, 0.0), _filled_like_line(x, 1.0), decay, x,
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
            _filled_like_line(x, 0.0), decay, x,
            body=_recurrence_body(dtype, line_rank, with_product=False),
            num_scan_inputs=2,
            scan_input_directions=[_direction(reverse_first)] * 2,
            scan_output_directions=[_direction(reverse_first)],
        )
        hh = op.Transpose(first[1], perm=_SWAP_LEADING)
        decay = op.Transpose(decay, perm=_SWAP_LEADING)
        second = _scan_op(2)(
            _filled_like_line(hh, 0.0), decay, hh,
            body=_recurrence_body(dtype, line_rank, with_product=False),
            num_scan_inputs=2,
            scan_input_directions=[_direction(reverse_second)] * 2,
            scan_output_directions=[_direction(reverse_second)],
        )
    h = second[1]  # (S2, S1, batch, groups, channels, N)
    c_l2 = op.Unsqueeze(op.Transpose(C, perm=_MAP_TO_L2[cols_first]), op.Constant(value_ints=[4]))
    readout = op.Mul(h, c_l2)
    # One state (the models' N = 1): dropping the axis is the sum, without ReduceSum's pass.
    return op.Squeeze(readout, axis_n) if nstate == 1 else op.ReduceSum(readout, axis_n, keepdims=0)


def first_pass_layout(map_values, columns_first: bool):
    """A map (batch, groups, channels, H, W) in the first-pass layout of routes with this pass order."""
    return op.Transpose(map_values, perm=_MAP_TO_L1[columns_first])


def to_map(y_l2, columns_first: bool):
    """A route output of :func:`scan_route` (second-pass layout) as (batch, groups, channels, H, W)."""
    return op.Transpose(y_l2, perm=_L2_TO_MAP[columns_first])


def _onnx_dtype(value) -> ir.DataType:
    if value.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        raise TypeError(f"the ONNX scan takes floating-point u, got {value.dtype}")
    return value.dtype


def _static_dim(value, axis: int, what: str) -> int:
    dim = value.shape[axis]
    if not isinstance(dim, int):
        raise ValueError(f"exporting the scan needs a static {what} (axis {axis} of {value.name}), got {dim}")
    return dim


def _projected_deltas(delta_low, weight, routes: Sequence[Route], dim: int) -> list:
    """Each route's full-rank step sizes in its first-pass layout (S1, S2, batch, 1, dim), from the
    low-rank (batch, K, R, H, W) and weight (K, dim, R).

    One batched MatMul with the channels last, (batch, K, H * W, dim): moving a map into a
    first-pass layout is then a transpose of contiguous channel rows, where from the channels-first
    (batch, K, dim, H, W) onnxruntime's Transpose gathers single values (6x slower at the first
    stage's maps; its Einsum for the same sum took 3x the MatMul's time too).
    """
    low = op.Transpose(op.Reshape(delta_low, op.Constant(value_ints=[0, 0, 0, -1])), perm=[0, 1, 3, 2])
    rows = op.Unsqueeze(op.Transpose(op.CastLike(weight, delta_low), perm=[0, 2, 1]), op.Constant(value_ints=[0]))
    full = op.MatMul(low, rows)  # (batch, K, H * W, dim)
    sizes = op.Concat(op.Shape(delta_low, end=2), op.Shape(delta_low, start=3), op.Constant(value_ints=[dim]), axis=0)
    full = op.Reshape(full, sizes)  # (batch, K, H, W, dim)
    parts = op.Split(full, axis=1, num_outputs=len(routes)) if len(routes) > 1 else [full]
    # (batch, 1, H, W, dim) -> (W, H, batch, 1, dim) rows first, (H, W, batch, 1, dim) columns first
    return [op.Transpose(part, perm=[2, 3, 0, 1, 4] if route.columns_first else [3, 2, 0, 1, 4])
            for part, route in zip(parts, routes)]


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
        deltas_l1 = _projected_deltas(delta, delta_proj_weight, route_list, dim)
    else:
        deltas = op.Split(delta, axis=1, num_outputs=num_routes) if num_routes > 1 else [delta]
        deltas_l1 = [first_pass_layout(d, route.columns_first) for d, route in zip(deltas, route_list)]
    nstate = _static_dim(A, 1, "state count")
    u_grouped = op.Unsqueeze(u, op.Constant(value_ints=[1]))  # (batch, 1, Di, H, W)
    A_routes = op.Reshape(A, op.Constant(value_ints=[num_routes, 1, dim, nstate]))
    bias_routes = None if delta_bias is None else op.Reshape(delta_bias, op.Constant(value_ints=[num_routes, 1, dim]))
    Bs = op.Split(B, axis=1, num_outputs=num_routes) if num_routes > 1 else [B]
    Cs = op.Split(C, axis=1, num_outputs=num_routes) if num_routes > 1 else [C]
    # Per pass order (rows first / columns first): u moved once into the routes' first-pass
    # layout (the second order's from the first's by swapping the two leading axes, which moves
    # whole rows, not single values), and their outputs summed in route order in their second-pass
    # layout.
    u_l1, y_l2 = {}, {}
    for k, route in enumerate(route_list):
        order = route.columns_first
        if order not in u_l1:
            u_l1[order] = (op.Transpose(u_l1[not order], perm=_SWAP_LEADING[:5]) if u_l1
                           else first_pass_layout(u_grouped, order))
        pick = op.Constant(value_ints=[k])
        y_route = scan_route(
            u_l1[order],
            deltas_l1[k],
            op.Squeeze(op.Gather(A_routes, pick, axis=0), op.Constant(value_ints=[0])),
            Bs[k], Cs[k],
            None if bias_routes is None else op.Squeeze(op.Gather(bias_routes, pick, axis=0), op.Constant(value_ints=[0])),
            delta_softplus, route, dtype, nstate,
        )
        y_l2[order] = op.Add(y_l2[order], y_route) if order in y_l2 else y_route
    y = None
    for order, y_order in y_l2.items():
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
        first_pass_layout(op.Reshape(u, as_map), route.columns_first),
        first_pass_layout(op.Reshape(delta, as_map), route.columns_first),
        op.Reshape(A, op.Constant(value_ints=[groups, -1, nstate])),
        op.Reshape(B, _dims_tensor(0, groups, nstate, height, width)),
        op.Reshape(C, _dims_tensor(0, groups, nstate, height, width)),
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

    from ..ops import _triton_cross_scan, cross_fused, fused, scan_triton  # noqa: F401  (registers the custom ops)

    return {
        torch.ops.vmamba2d.cross_selective_scan_2d_fwd.default: cross_selective_scan_2d_onnx,
        torch.ops.vmamba2d.selective_scan_2d_fwd.default: selective_scan_2d_onnx,
        torch.ops.vmamba2d.cross_selective_scan_2d_triton_fwd.default: cross_selective_scan_2d_triton_onnx,
        # same schema as the compiled single-route op
        torch.ops.vmamba2d.selective_scan_2d_triton_fwd.default: selective_scan_2d_onnx,
    }
