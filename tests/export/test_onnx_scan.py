"""ONNX translations of the scan custom ops (vmamba2d.export.onnx_scan), op by op: exported with
torch.onnx.export(dynamo=True), run in onnxruntime, compared with the fp64 loop reference."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
from torch import nn

from vmamba2d.export.onnx_scan import _softplus, translation_table
from vmamba2d.ops import CROSS_ROUTES, Route, cross_selective_scan_2d, selective_scan_2d
from vmamba2d.ops.interface import cross_scan_per_route
from vmamba2d.ops import selective_scan_2d_reference

BATCH, DIM, NSTATE, HEIGHT, WIDTH = 2, 3, 2, 5, 7
ALL_ROUTES = tuple(Route.from_code(code) for code in range(16))  # every 2D and flat route
GROUPS = 2


class ScanOps(nn.Module):
    """Calls both custom ops through the compiled CPU backend:
    the four-route op on all 16 routes (D, delta_bias, softplus), on the cross routes without
    D / delta_bias / softplus, and the single-route op with two channel groups."""

    def forward(self, u, delta, A, B, C, D, bias, u1, delta1, A1, B1, C1, D1, bias1):
        codes = [r.code for r in ALL_ROUTES]
        y_all = cross_selective_scan_2d(u, delta, A, B, C, D, bias, True, routes=codes, backend="cpu")
        k = len(CROSS_ROUTES)
        y_plain = cross_selective_scan_2d(
            u, delta[:, :k].abs(), A[: k * DIM], B[:, :k], C[:, :k], None, None, False,
            routes=list(CROSS_ROUTES), backend="cpu",
        )
        y_single = selective_scan_2d(u1, delta1, A1, B1, C1, D1, bias1, True, height=HEIGHT, width=WIDTH, backend="cpu")
        return y_all, y_plain, y_single


def _inputs() -> tuple:
    g = torch.Generator().manual_seed(0)
    k = len(ALL_ROUTES)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    length = HEIGHT * WIDTH
    return (
        r(BATCH, DIM, HEIGHT, WIDTH), r(BATCH, k, DIM, HEIGHT, WIDTH),
        -torch.rand(k * DIM, NSTATE, generator=g) - 0.1,
        r(BATCH, k, NSTATE, HEIGHT, WIDTH), r(BATCH, k, NSTATE, HEIGHT, WIDTH), r(k * DIM), r(k * DIM),
        r(BATCH, 2 * DIM, length), r(BATCH, 2 * DIM, length),
        -torch.rand(2 * DIM, NSTATE, generator=g) - 0.1,
        r(BATCH, GROUPS, NSTATE, length), r(BATCH, GROUPS, NSTATE, length), r(2 * DIM), r(2 * DIM),
    )


def _reference(args: tuple) -> list[np.ndarray]:
    u, delta, A, B, C, D, bias, u1, delta1, A1, B1, C1, D1, bias1 = (t.double() for t in args)
    k = len(CROSS_ROUTES)
    y_all = cross_scan_per_route(u, delta, A, B, C, D, bias, True, ALL_ROUTES, "reference", torch.float64)
    y_plain = cross_scan_per_route(u, delta[:, :k].abs(), A[: k * DIM], B[:, :k], C[:, :k], None, None, False,
                                   CROSS_ROUTES, "reference", torch.float64)
    y_single = selective_scan_2d_reference(u1, delta1, A1, B1, C1, D1, bias1, True, height=HEIGHT, width=WIDTH)
    return [y.numpy() for y in (y_all, y_plain, y_single)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx_scan") / "scan_ops.onnx"
    program = torch.onnx.export(ScanOps().eval(), _inputs(), dynamo=True, custom_translation_table=translation_table(),
                                verbose=False)
    program.save(str(path), external_data=False)
    return path


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)


@pytest.mark.slow
def test_scan_ops_become_standard_onnx_operators(exported):
    model = onnx.load(str(exported))
    onnx.checker.check_model(model, full_check=True)
    assert not model.functions
    assert {imp.domain for imp in model.opset_import} == {""}
    ops = {(node.domain, node.op_type) for node in _nodes(model.graph)}
    assert all(domain == "" for domain, _ in ops), ops
    assert ("", "Scan") in ops


def test_onnxruntime_matches_the_fp64_loop_reference_on_every_route(exported):
    args = _inputs()
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    got = session.run(None, feeds)
    for name, g, want in zip(("16 routes", "cross, no D / bias / softplus", "single route, 2 groups"),
                             got, _reference(args)):
        assert g.shape == want.shape, name
        error = np.abs(g - want).max() / np.abs(want).max()
        assert error <= 1e-5, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("dtype, ir_dtype, max_error", [
    (np.float32, ir.DataType.FLOAT, 4e-7),   # a few ulps, as onnxruntime's own Softplus (3.1e-7)
    (np.float64, ir.DataType.DOUBLE, 1e-15),
])
def test_softplus_lowering_keeps_small_steps_relatively_exact(dtype, ir_dtype, max_error):
    # Evaluated op by op in onnxruntime (onnxscript's eager mode), against numpy's log(1 + exp(z)).
    z = np.concatenate([np.linspace(-80, 80, 20001), [-1e30, -200, -30, -7, -1e-6, 0, 1e-6, 15, 16, 17, 37, 1e30]])
    got = np.asarray(_softplus(z.astype(dtype), ir_dtype).value).astype(np.float64)
    want = np.logaddexp(0.0, z.astype(dtype).astype(np.float64))
    normal = want > np.finfo(dtype).tiny
    error = np.abs(got[normal] - want[normal]) / want[normal]
    assert error.max() <= max_error, (error.max(), z[normal][error.argmax()])
    assert np.all(got[~normal] <= np.finfo(dtype).tiny)
    special = np.asarray(_softplus(np.array([np.nan, np.inf, -np.inf], dtype=dtype), ir_dtype).value)
    assert np.isnan(special[0]) and special[1] == np.inf and special[2] == 0.0


class TritonScanOps(nn.Module):
    """Calls the Triton kernels' custom ops directly (torch.export traces them through their fake
    implementations, so no GPU is needed): the four-route op on the cross routes and the
    single-route op with two channel groups."""

    def forward(self, u, delta, A, B, C, D, bias, u1, delta1, A1, B1, C1, D1, bias1):
        k = len(CROSS_ROUTES)
        y_cross = torch.ops.vmamba2d.cross_selective_scan_2d_triton_fwd(
            u, delta[:, :k].contiguous(), A[: k * DIM], B[:, :k].contiguous(), C[:, :k].contiguous(), D[: k * DIM],
            bias[: k * DIM], True, [r.code for r in CROSS_ROUTES], True, False)[0]
        y_single = torch.ops.vmamba2d.selective_scan_2d_triton_fwd(
            u1, delta1, A1, B1, C1, D1, bias1, True, HEIGHT, WIDTH, True, False)[0]
        return y_cross, y_single


def test_triton_ops_export_with_the_default_translations(tmp_path):
    # no custom_translation_table: import vmamba2d.export registered every scan op's translation
    path = tmp_path / "triton_ops.onnx"
    torch.onnx.export(TritonScanOps().eval(), _inputs(), str(path), dynamo=True, verbose=False)
    args = _inputs()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    got = session.run(None, feeds)
    u, delta, A, B, C, D, bias = (t.double() for t in args[:7])
    k = len(CROSS_ROUTES)
    want_cross = cross_scan_per_route(u, delta[:, :k], A[: k * DIM], B[:, :k], C[:, :k], D[: k * DIM],
                                      bias[: k * DIM], True, CROSS_ROUTES, "reference", torch.float64)
    want_single = _reference(args)[2]
    for name, g, want in (("cross routes", got[0], want_cross.numpy()), ("single route", got[1], want_single)):
        assert g.shape == want.shape, name
        error = np.abs(g - want).max() / np.abs(want).max()
        assert error <= 1e-5, f"{name}: relative error {error:.2e}"
