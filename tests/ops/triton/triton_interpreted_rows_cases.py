"""The Triton row-streaming forward (vmamba2d.ops.triton.rows) run by Triton's interpreter on CPU
tensors. Run by ``tests/ops/triton/test_scan_triton_rows.py`` in a fresh Python with ``TRITON_INTERPRET=1``
set before triton is imported; by hand:
``TRITON_INTERPRET=1 python -m pytest tests/ops/triton/triton_interpreted_rows_cases.py``.

Forward calls with no gradient and N = 1 take the row-streaming kernel (the plan rule of
vmamba2d.ops.triton.rows_plan); each test checks that it ran (or, pinned to ``tiles``, that it did
not) and compares y with the independent fp64 reference ``selective_scan_2d_reference`` on the
same (rounded) inputs, and the two Triton forwards with each other. The interpreter shortcuts of
tests/ops/triton/triton_interpreted_cases.py (a doubling evaluation of ``tl.associative_scan``) apply here too.
"""
from __future__ import annotations

import pytest

from support.triton_interpreter import require_interpreter

require_interpreter("tests/ops/triton/test_scan_triton_rows.py")

import torch  # noqa: E402
import triton_interpreted_cases  # noqa: E402,F401  (installs the interpreter shortcuts)
from support.scan_cases import make_inputs  # noqa: E402
from vmamba2d.ops import cross_selective_scan_2d_reference, selective_scan_2d, selective_scan_2d_reference  # noqa: E402
from vmamba2d.ops.routes import Route  # noqa: E402
from vmamba2d.ops.triton import rows_plan  # noqa: E402

# Tolerances against the fp64 reference on the rounded inputs: fp32 arithmetic throughout, y
# rounded once to the output dtype (bf16 keeps 8 bits, fp16 11).
TOLERANCES = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(TOLERANCES)
# (height, width, batch, dim, groups, use_d, use_bias, softplus)
SHAPES = [
    (7, 7, 2, 4, 2, True, True, True),
    (14, 14, 1, 3, 1, True, False, True),
    (5, 9, 3, 6, 3, False, True, False),
    (1, 1, 2, 4, 2, True, True, True),
    (3, 17, 1, 2, 1, False, False, True),
]


def _case_id(case):
    h, w, b, d, g, use_d, use_bias, sp = case
    return f"{h}x{w}-b{b}-d{d}-g{g}" + "-D" * use_d + "-bias" * use_bias + "-softplus" * sp


@pytest.fixture
def designs(monkeypatch):
    """The designs the Triton forward chose during the test, in call order."""
    chosen = []
    decide = rows_plan.forward_design

    def recording(*args):
        chosen.append(decide(*args))
        return chosen[-1]

    import vmamba2d.ops.triton.ops as triton_ops

    monkeypatch.setattr(triton_ops, "forward_design", recording)
    return chosen


def _inputs(case, dtype, seed):
    height, width, batch, dim, groups, use_d, use_bias, softplus = case
    inputs = make_inputs(batch, dim, groups, 1, height, width, use_d=use_d, use_bias=use_bias,
                         softplus=softplus, seed=seed)
    for name in ("u", "delta", "B", "C"):
        inputs[name] = inputs[name].to(dtype)
    for name in ("A", "D", "delta_bias"):
        if inputs[name] is not None:
            inputs[name] = inputs[name].float()
    return inputs


def _reference(inputs, height, width):
    as64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return selective_scan_2d_reference(**as64, height=height, width=width)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", SHAPES, ids=_case_id)
def test_rows_forward_matches_reference(case, dtype, designs):
    height, width = case[:2]
    inputs = _inputs(case, dtype, seed=height * 100 + width)
    with torch.no_grad():
        y = selective_scan_2d(**inputs, height=height, width=width, backend="triton")
    assert designs == ["rows"]
    assert y.dtype == dtype and y.shape == inputs["u"].shape
    expected = _reference(inputs, height, width)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol * expected.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_writes_fp32_when_asked(dtype, designs):
    inputs = _inputs(SHAPES[0], dtype, seed=5)
    with torch.no_grad():
        y = selective_scan_2d(**inputs, height=7, width=7, out_dtype=torch.float32, backend="triton")
    assert designs == ["rows"] and y.dtype == torch.float32
    expected = _reference(inputs, 7, 7)
    torch.testing.assert_close(y.double(), expected, rtol=2e-5, atol=2e-5 * expected.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [SHAPES[0], SHAPES[2]], ids=_case_id)
def test_rows_and_tiles_agree(case, dtype, designs, monkeypatch):
    height, width = case[:2]
    inputs = _inputs(case, dtype, seed=7)
    with torch.no_grad():
        rows = selective_scan_2d(**inputs, height=height, width=width, out_dtype=torch.float32, backend="triton")
        monkeypatch.setenv(rows_plan.PLAN_ENV_VAR, "tiles")
        tiles = selective_scan_2d(**inputs, height=height, width=width, out_dtype=torch.float32, backend="triton")
    assert designs == ["rows", "tiles"]
    # Both accumulate in fp32 from the same inputs; they differ only in the order of the row scan.
    torch.testing.assert_close(rows, tiles, rtol=1e-5, atol=1e-5 * tiles.abs().max().item())


def test_gradients_keep_the_tiled_forward(designs):
    inputs = _inputs(SHAPES[0], torch.float32, seed=9)
    inputs["u"].requires_grad_(True)
    y = selective_scan_2d(**inputs, height=7, width=7, backend="triton")
    y.sum().backward()
    assert designs == ["tiles"] and inputs["u"].grad is not None


def test_rule_and_pin(monkeypatch):
    assert rows_plan.forward_design(1, 56, 56, torch.bfloat16, False) == "rows"
    assert rows_plan.forward_design(4, 7, 7, torch.float32, False) == "tiles"
    assert rows_plan.forward_design(1, 7, rows_plan.MAX_ROWS_WIDTH + 1, torch.float32, False) == "tiles"
    assert rows_plan.forward_design(1, 7, 7, torch.float64, False) == "tiles"
    assert rows_plan.forward_design(1, 7, 7, torch.float32, True) == "tiles"
    monkeypatch.setenv(rows_plan.PLAN_ENV_VAR, "rows")
    with pytest.raises(ValueError, match="d_state 1 only"):
        rows_plan.forward_design(2, 7, 7, torch.float32, False)
    monkeypatch.setenv(rows_plan.PLAN_ENV_VAR, "fast")
    with pytest.raises(ValueError, match="VMAMBA2D_TRITON_PLAN: expected one of"):
        rows_plan.forward_design(1, 7, 7, torch.float32, False)


@pytest.mark.parametrize("block_w", [1, 8, 16, 64, 256])
def test_tuning_candidates_keep_the_row_layout(block_w):
    """Every candidate: the same elements per thread, at least block_w / 32 warps."""
    configs = rows_plan.tuning_configs(block_w)
    assert configs and len(set(configs)) == len(configs)
    for block_m, warps in configs:
        assert block_m * block_w == rows_plan.ELEMENTS_PER_THREAD * 32 * warps
        assert warps * 32 >= block_w


@pytest.mark.parametrize("route", range(8))
@pytest.mark.parametrize("shape", [(5, 9), (7, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_rows_kernel_on_every_2d_route(route, shape):
    """The kernel launched with each 2D route code against the reference of that one route."""
    height, width = shape
    batch, dim = 2, 3
    inputs = make_inputs(batch, dim, 1, 1, height, width, seed=route * 10 + height)
    u = inputs["u"].float().view(batch, dim, height, width)
    delta = inputs["delta"].float().view(batch, 1, dim, height, width)
    B, C = (inputs[k].float().view(batch, 1, 1, height, width) for k in ("B", "C"))
    A, D, bias = inputs["A"].float(), inputs["D"].float(), inputs["delta_bias"].float()
    y = rows_plan.launch_rows_forward(u, delta, A, B, C, D, bias, True, False, 1, route=route)
    expected = cross_selective_scan_2d_reference(u.double(), delta.double(), A.double(), B.double(), C.double(),
                                                 D.double(), bias.double(), True, routes=[Route.from_code(route)])
    torch.testing.assert_close(y.double(), expected, rtol=2e-5, atol=2e-5 * expected.abs().max().item())


def test_rows_kernel_rejects_what_it_cannot_scan():
    u = torch.zeros(1, 1, rows_plan.MAX_ROWS_WIDTH + 1, 2)
    delta, B = u.view(1, 1, 1, *u.shape[2:]), u.view(1, 1, 1, *u.shape[2:])
    with pytest.raises(ValueError, match="lines up to"):
        rows_plan.launch_rows_forward(u, delta, torch.zeros(1, 1), B, B, None, None, True, False, 1, route=4)
    with pytest.raises(ValueError, match="2D route code"):
        rows_plan.launch_rows_forward(u, delta, torch.zeros(1, 1), B, B, None, None, True, False, 1, route=8)
