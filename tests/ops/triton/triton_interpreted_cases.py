"""Triton scan kernels run by Triton's interpreter on CPU tensors (no GPU needed).

Not collected by a plain ``pytest`` run: ``tests/ops/triton/test_scan_triton.py::test_kernels_in_the_interpreter``
runs this file in a fresh interpreter with ``TRITON_INTERPRET=1`` set before triton is first
imported (triton's own ``@jit`` helpers such as ``tl.zeros`` are built at import time, interpreted
only if the variable was set by then; ``import vmamba2d`` imports triton through torchvision).
By hand: ``TRITON_INTERPRET=1 python -m pytest tests/ops/triton/triton_interpreted_cases.py``.

The kernels are compared with the independent fp64 loop reference of test_scan_ops: forward and
every gradient on a shape matrix with edge tiles (small tiles forced with VMAMBA2D_TRITON_TILE),
1 x L / L x 1 maps, groups, N up to 64, odd batches; gradcheck; fp32 / half inputs; out_dtype;
bad inputs; torch.compile; the custom ops' fake implementations; the backward's reuse of the
forward's carries.

The interpreter evaluates a ``tl.associative_scan`` with a user combine one element at a time in
Python (minutes for these cases); this module replaces that evaluation with a doubling
(Hillis-Steele) one that applies the kernel's own combine function to whole slices. It also
skips the interpreter's re-patching of triton.language on every call of a ``@jit`` helper after
the helper's first call. One test checks both shortcuts against the interpreter's own evaluation.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from support.triton_interpreter import record_kernel_launches, require_interpreter

require_interpreter("tests/ops/triton/test_scan_triton.py")

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402
from triton.runtime.errors import InterpreterError  # noqa: E402

from support.scan_cases import (  # noqa: E402
    BAD_INPUTS, TENSOR_ARGS, assert_half_precision_close, grads, make_inputs, reference_scan)
from vmamba2d.ops import resolve_backend, selective_scan_2d  # noqa: E402
from vmamba2d.ops.triton import launch as triton_launch  # noqa: E402
from vmamba2d.ops.triton import ops as triton_ops  # noqa: E402

KERNELS_IMPORTED_BY_THE_PACKAGE = triton_launch.KERNELS_MODULE in sys.modules

INTERPRETER_SCAN = interpreter.ScanOps.generic_scan


def _doubling_scan(self, inputs):
    """Inclusive scan of ``inputs`` along ``self.axis`` with the kernel's combine function in
    ceil(log2(n)) whole-block steps: step k combines each prefix with the one 2**k positions
    earlier (blocks keep their power-of-two shapes; positions with no predecessor keep theirs)."""
    axis = self.axis
    values = [arg.handle.data for arg in inputs]
    length = values[0].shape[axis]
    position = np.arange(length).reshape([-1 if d == axis else 1 for d in range(values[0].ndim)])
    offset = 1
    while offset < length:
        earlier = [self.to_tensor(np.roll(v, offset, axis=axis), a.dtype) for v, a in zip(values, inputs)]
        current = [self.to_tensor(v, a.dtype) for v, a in zip(values, inputs)]
        combined = self.combine_fn.fn(*earlier, *current)
        combined = combined if isinstance(combined, tuple) else (combined,)
        values = [np.where(position >= offset, c.handle.data, v) for c, v in zip(combined, values)]
        offset *= 2
    return [self.to_tensor(v, a.dtype) for v, a in zip(values, inputs)]


interpreter.ScanOps.generic_scan = _doubling_scan

INTERPRETER_DEVICE_CALL = interpreter.InterpretedFunction.__call__
_helpers_called = set()


def _device_call_patching_once(self, *args, **kwargs):
    """A ``@jit`` helper called from a kernel. Triton's interpreter patches triton.language again
    on every such call (inspect.getmembers and a sort per call: most of these tests' time); the
    kernel launch around the call has patched the language of the kernels' module, and a helper's
    first call patches what its own module needs (those patches are never undone), so later calls
    run the helper directly."""
    if self.fn not in _helpers_called:
        _helpers_called.add(self.fn)
        return INTERPRETER_DEVICE_CALL(self, *args, **kwargs)
    try:
        return self.rewrite()(*args, **kwargs)
    except Exception as err:
        raise InterpreterError(repr(err)) from err


interpreter.InterpretedFunction.__call__ = _device_call_patching_once
# Programs pack several channel blocks here as they do on the model's large grids (the tests'
# grids are far below the launcher's threshold).
triton_launch.MIN_PROGRAMS = 1


def triton_scan(**kwargs):
    return selective_scan_2d(**kwargs, backend="triton")


# --------------------------------------------------------------------------------------------
# Interpreter: forward and gradients against the fp64 loop reference
# --------------------------------------------------------------------------------------------
# (height, width, batch, dim, groups, N, use_d, use_bias, softplus, tile or None for the default)
CASES = [
    (1, 1, 2, 4, 2, 4, True, True, True, None),
    (1, 17, 1, 2, 1, 16, True, False, True, "1x8"),  # 1 x L, a partial last tile
    (17, 1, 1, 2, 2, 4, False, True, False, "8x1"),  # L x 1
    (7, 7, 2, 4, 2, 4, True, True, True, None),
    (9, 13, 1, 6, 2, 1, True, True, False, "4x8"),  # edge tiles both ways; 3 channels share B / C
    (13, 29, 1, 4, 1, 16, True, True, True, None),  # default tiling with edges; 4 channel blocks
    (5, 6, 3, 2, 1, 64, True, True, True, None),  # N = 64, odd batch
    (33, 65, 1, 2, 1, 2, False, True, True, None),  # several default tiles per row and column
    (6, 10, 1, 6, 1, 1, True, True, True, None),  # 6 channel blocks run by one program
]


def _case_id(case):
    h, w, b, d, g, n, use_d, use_bias, sp, tile = case
    return (f"{h}x{w}-b{b}-d{d}-g{g}-N{n}" + "-D" * use_d + "-bias" * use_bias + "-softplus" * sp
            + (f"-tile{tile}" if tile else ""))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_and_gradients_match_reference(case, monkeypatch):
    height, width, batch, dim, groups, nstate, use_d, use_bias, softplus, tile = case
    if tile:
        monkeypatch.setenv(triton_launch.TILE_ENV_VAR, tile)
    inputs = make_inputs(batch, dim, groups, nstate, height, width, use_d=use_d,
                         use_bias=use_bias, softplus=softplus, seed=height * 100 + width)
    y = triton_scan(**inputs, height=height, width=width)
    assert y.dtype == torch.float64 and y.shape == (batch, dim, height * width)
    torch.testing.assert_close(y, reference_scan(**inputs, height=height, width=width),
                               rtol=1e-10, atol=1e-10)
    dy = torch.randn(batch, dim, height * width, generator=torch.Generator().manual_seed(3),
                     dtype=torch.float64)
    expected = grads(inputs, height, width, dy, reference_scan)
    got = grads(inputs, height, width, dy, triton_scan)
    assert set(got) == set(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-9, msg=name)


def test_interpreter_shortcuts_match_the_interpreters_own_evaluation(monkeypatch):
    """The fast scan and the patch-once helper calls installed above against Triton's own
    element-by-element scan and per-call patching, on one small tile."""
    inputs = make_inputs(1, 2, 1, 2, 3, 4, seed=53)
    dy = torch.randn(1, 2, 12, generator=torch.Generator().manual_seed(54), dtype=torch.float64)
    fast = grads(inputs, 3, 4, dy, triton_scan)
    monkeypatch.setattr(interpreter.ScanOps, "generic_scan", INTERPRETER_SCAN)
    monkeypatch.setattr(interpreter.InterpretedFunction, "__call__", INTERPRETER_DEVICE_CALL)
    slow = grads(inputs, 3, 4, dy, triton_scan)
    for name in fast:
        torch.testing.assert_close(fast[name], slow[name], rtol=1e-13, atol=1e-13, msg=name)


@pytest.mark.parametrize("case", [
    (2, 3, 1, 2, 2, 2, True, True, True, "1x2"),
    (1, 4, 1, 2, 1, 3, False, False, False, "1x2"),
    (3, 1, 1, 2, 2, 1, True, False, True, "2x1"),
], ids=_case_id)
def test_gradcheck(case, monkeypatch):
    height, width, batch, dim, groups, nstate, use_d, use_bias, softplus, tile = case
    monkeypatch.setenv(triton_launch.TILE_ENV_VAR, tile)
    inputs = make_inputs(batch, dim, groups, nstate, height, width, use_d=use_d,
                         use_bias=use_bias, softplus=softplus, seed=7)
    names = [k for k in TENSOR_ARGS if inputs[k] is not None]
    leaves = tuple(inputs[k].clone().requires_grad_() for k in names)

    def scan(*tensors):
        return triton_scan(**dict(inputs, **dict(zip(names, tensors))), height=height, width=width)

    assert torch.autograd.gradcheck(scan, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


def test_fp32_inputs_accumulate_to_fp64_reference(monkeypatch):
    monkeypatch.setenv(triton_launch.TILE_ENV_VAR, "4x8")
    height, width = 9, 13
    inputs = make_inputs(1, 4, 2, 4, height, width, seed=61)
    dy = torch.randn(1, 4, height * width, generator=torch.Generator().manual_seed(62), dtype=torch.float64)
    expected = grads(inputs, height, width, dy, reference_scan)
    fp32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    got = grads(fp32, height, width, dy.float(), triton_scan)
    for name in expected:
        assert got[name].dtype == torch.float32, name
        torch.testing.assert_close(got[name].double(), expected[name], rtol=1e-4, atol=1e-4, msg=name)
    y = triton_scan(**fp32, height=height, width=width)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference_scan(**inputs, height=height, width=width),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_fp32(half, monkeypatch):
    height, width = 6, 5
    inputs = make_inputs(2, 4, 2, 4, height, width, dtype=torch.float32, seed=23)
    for name in ("u", "delta", "B", "C"):  # activations half; A, D, delta_bias stay fp32
        inputs[name] = inputs[name].to(half)
    exact = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    y_ref = reference_scan(**exact, height=height, width=width)
    y_fp32 = triton_scan(**inputs, height=height, width=width, out_dtype=torch.float32)
    assert y_fp32.dtype == torch.float32
    # fp32 accumulation: far below half precision from the exact result on the rounded inputs.
    torch.testing.assert_close(y_fp32.double(), y_ref, rtol=2e-5, atol=2e-5)

    dy = torch.randn(2, 4, height * width, generator=torch.Generator().manual_seed(24)).to(half)
    expected = grads(exact, height, width, dy.double(), reference_scan)
    got = grads(inputs, height, width, dy, triton_scan)
    y_half = triton_scan(**inputs, height=height, width=width)
    assert y_half.dtype == half
    assert_half_precision_close(y_half, y_ref, got, expected, inputs)


def test_out_dtype_and_mixed_parameter_dtypes(monkeypatch):
    inputs = make_inputs(1, 2, 1, 3, 4, 5, dtype=torch.float32, seed=29)
    y = triton_scan(**inputs, height=4, width=5, out_dtype=torch.float64)
    assert y.dtype == torch.float64
    exact = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    torch.testing.assert_close(y, reference_scan(**exact, height=4, width=5), rtol=1e-5, atol=1e-5)
    # fp64 activations with fp32 parameters: fp64 accumulation, gradients in each input's dtype.
    mixed = dict(exact, A=inputs["A"], D=inputs["D"], delta_bias=inputs["delta_bias"])
    leaves = {k: mixed[k].clone().requires_grad_() for k in TENSOR_ARGS}
    y = triton_scan(**dict(mixed, **leaves), height=4, width=5)
    assert y.dtype == torch.float64
    y.sum().backward()
    for name, leaf in leaves.items():
        assert leaf.grad.dtype == leaf.dtype, name


def test_non_contiguous_inputs_and_output_gradient(monkeypatch):
    batch, dim, groups, nstate, height, width = 2, 4, 2, 3, 3, 5
    length = height * width
    gen = torch.Generator().manual_seed(17)
    kwargs = dict(
        u=torch.randn(batch, length, dim, generator=gen, dtype=torch.float64).transpose(1, 2),
        delta=torch.randn(batch, dim, 2 * length, generator=gen, dtype=torch.float64)[..., ::2],
        A=-(0.2 + torch.rand(nstate, dim, generator=gen, dtype=torch.float64)).t(),
        B=torch.randn(batch, nstate, groups, length, generator=gen, dtype=torch.float64).transpose(1, 2),
        C=torch.randn(groups, batch, nstate, length, generator=gen, dtype=torch.float64).transpose(0, 1),
        D=torch.randn(2 * dim, generator=gen, dtype=torch.float64)[::2],
        delta_bias=torch.randn(dim, 2, generator=gen, dtype=torch.float64)[:, 1],
        delta_softplus=True,
    )
    dy = torch.randn(batch, length, dim, generator=gen, dtype=torch.float64).transpose(1, 2)
    expected = grads(kwargs, height, width, dy, reference_scan)
    got = grads(kwargs, height, width, dy, triton_scan)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-9, msg=name)


def test_env_override_selects_triton(monkeypatch):
    monkeypatch.setenv("VMAMBA2D_SCAN_BACKEND", "triton")
    assert resolve_backend("auto", torch.device("cpu")) == "triton"
    inputs = make_inputs(1, 2, 1, 2, 2, 3, seed=5)
    torch.testing.assert_close(selective_scan_2d(**inputs, height=2, width=3),
                               reference_scan(**inputs, height=2, width=3))


# --------------------------------------------------------------------------------------------
# Bad inputs: the same checks and messages as the other backends
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_naming_the_argument(bad, monkeypatch):
    _, changes, height, width, error, fragment = bad
    inputs = dict(make_inputs(2, 4, 2, 3, 3, 4, dtype=torch.float32, seed=31), **changes)
    with pytest.raises(error, match=fragment):
        triton_scan(**inputs, height=height, width=width)


def test_too_many_states(monkeypatch):
    inputs = make_inputs(1, 2, 1, 65, 2, 2, dtype=torch.float32)
    with pytest.raises(ValueError, match="N=65"):
        triton_scan(**inputs, height=2, width=2)


def test_bad_tile_override(monkeypatch):
    monkeypatch.setenv(triton_launch.TILE_ENV_VAR, "3x8")
    with pytest.raises(ValueError, match=triton_launch.TILE_ENV_VAR):
        triton_scan(**make_inputs(1, 2, 1, 2, 2, 2, dtype=torch.float32), height=2, width=2)


# --------------------------------------------------------------------------------------------
# torch.compile and the custom ops' fake implementations
# --------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph_traces_the_triton_op(monkeypatch):
    import torch._dynamo

    inputs = make_inputs(1, 4, 2, 2, 3, 4, dtype=torch.float32, seed=37)

    def layer(u, delta, A, B, C, D, delta_bias):
        y = selective_scan_2d(u, delta, A, B, C, D, delta_bias, True, height=3, width=4, backend="triton")
        return torch.tanh(y) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    eager_leaves = [inputs[k].clone().requires_grad_() for k in TENSOR_ARGS]
    compiled_leaves = [inputs[k].clone().requires_grad_() for k in TENSOR_ARGS]
    expected = layer(*eager_leaves)
    got = compiled(*compiled_leaves)
    torch.testing.assert_close(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for name, a, b in zip(TENSOR_ARGS, eager_leaves, compiled_leaves):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
    torch._dynamo.reset()


def test_custom_op_fake_implementations_pass_opcheck(monkeypatch):
    inputs = make_inputs(1, 4, 2, 2, 2, 3, dtype=torch.float32, seed=41)
    args = [inputs[k] for k in TENSOR_ARGS]
    torch.library.opcheck(triton_ops.selective_scan_2d_triton_fwd, (*args, True, 2, 3, False, True),
                          test_utils=("test_schema", "test_faketensor"))
    _, vcarry, hcarry = triton_ops.selective_scan_2d_triton_fwd(*args, True, 2, 3, False, True)
    dy = torch.randn(1, 4, 6)
    torch.library.opcheck(triton_ops.selective_scan_2d_triton_bwd, (*args, True, 2, 3, dy, vcarry, hcarry),
                          test_utils=("test_schema", "test_faketensor"))


def test_the_backward_reuses_the_forwards_carries(monkeypatch):
    """The forward saves the tile carries only when a gradient is needed; the backward op then
    launches the backward kernel alone (no second forward sweep) and refuses missing carries."""
    inputs = make_inputs(1, 4, 2, 2, 3, 4, seed=43)
    launched = record_kernel_launches(monkeypatch)
    with torch.no_grad():
        y_plain = triton_scan(**inputs, height=3, width=4)
    leaves = {k: inputs[k].clone().requires_grad_() for k in TENSOR_ARGS}
    y = triton_scan(**dict(inputs, **leaves), height=3, width=4)
    assert launched == ["scan2d_fwd_kernel", "scan2d_fwd_kernel"]
    y.sum().backward()
    assert launched == ["scan2d_fwd_kernel", "scan2d_fwd_kernel", "scan2d_bwd_kernel"]
    assert torch.equal(y.detach(), y_plain)

    args = [inputs[k] for k in TENSOR_ARGS]
    _, no_v, no_h = triton_ops.selective_scan_2d_triton_fwd(*args, True, 3, 4, False, False)
    assert no_v.numel() == 0 and no_h.numel() == 0
    with pytest.raises(ValueError, match="save_carries=True"):
        triton_ops.selective_scan_2d_triton_bwd(*args, True, 3, 4, torch.ones_like(y_plain), no_v, no_h)


def test_importing_the_package_does_not_import_the_kernels():
    """The kernel module (the one place that decorates Triton kernels) loads only on first use."""
    assert not KERNELS_IMPORTED_BY_THE_PACKAGE
