"""The v4 forwards the NVRTC path dispatches to (PL, RS, the four-route RS kernel) and its RS backwards
of both ops (VMAMBA2D_SCAN_BACKWARD=auto) on a GPU, against the fp64 references and against the v3
kernels (VMAMBA2D_SCAN_PLAN=v3, the backward's default) on the same inputs. GPU only
(``-m cuda``; `make gpu-check` runs them); without a GPU the launch glue is tested by
test_nvrtc_rows_launch.py / test_cross_rows_launch.py and the kernel bodies by the host emulation."""
from __future__ import annotations

import pytest
import torch

from support.rows_cases import make_inputs, reference
from vmamba2d.ops import cross_selective_scan_2d_reference
from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops.compiled import cross_rows_backward, cross_rows_launch, nvrtc, rows_launch

HAS_GPU = torch.cuda.is_available()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")]
# Largest |y - reference| / max |reference| per y type (the four-route kernel rounds a 2-byte y once
# more, between its two sweeps).
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.4e-2}
CODES = [0, 4, 3, 7]


@pytest.fixture(scope="module")
def kernels():
    from vmamba2d.ops.compiled import nvrtc_backend

    try:
        return nvrtc_backend.nvrtc_kernels()
    except nvrtc.NvrtcUnavailable as err:
        pytest.skip(f"no NVRTC path: {err}")


def relative_error(y, expected) -> float:
    return ((y.double().cpu() - expected).abs().max() / expected.abs().max()).item()


# Few cases: each first use compiles its kernels with NVRTC inside gpu-check's test budget.
@pytest.mark.parametrize("dtype,side,design", [(torch.float32, 7, "pl"), (torch.bfloat16, 7, "pl"),
                                               (torch.float16, 8, "pl"), (torch.float32, 56, "rs"),
                                               (torch.bfloat16, 56, "rs"), (torch.bfloat16, 14, "rs")])
def test_single_route_forward_by_the_rule(kernels, monkeypatch, dtype, side, design):
    x = make_inputs(3, 24, 2, side, side, dtype, seed=side)
    gpu = {k: (v.cuda() if v is not None else None) for k, v in x.items()}
    args = (gpu["u"], gpu["delta"], gpu["A"], gpu["B"], gpu["C"], gpu["D"], gpu["delta_bias"])
    device = kernels.launcher.device_info(gpu["u"].device.index)
    assert rows_launch.forward_design(*args, side, False, False, device)[0] == design
    expected = reference(x, side, side, 0)
    for out_fp32 in (False, True):
        y = kernels.forward(*args, True, side, side, out_fp32, False)[0]
        assert y.dtype == (torch.float32 if out_fp32 else dtype)
        assert relative_error(y, expected) <= TOLERANCE[torch.float32 if out_fp32 else dtype]
    monkeypatch.setenv(rows_launch.PLAN_ENV, "v3")
    v3 = kernels.forward(*args, True, side, side, False, False)[0]
    assert relative_error(v3, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype,side,channels_last", [(torch.float32, 56, False), (torch.bfloat16, 56, True),
                                                      (torch.bfloat16, 14, False), (torch.float32, 7, True)])
def test_four_route_forward_by_the_rule(kernels, monkeypatch, dtype, side, channels_last):
    g = torch.Generator().manual_seed(side)
    batch, dim = 2, 16
    u = torch.randn(batch, dim, side, side, generator=g)
    delta = torch.randn(batch, 4, dim, side, side, generator=g) * 0.5 - 1.0
    B, C = (torch.randn(batch, 4, 1, side, side, generator=g) for _ in range(2))
    A = -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05)
    D, bias = torch.randn(4 * dim, generator=g), torch.randn(4 * dim, generator=g) * 0.3
    u, delta, B, C = (t.to(dtype) for t in (u, delta, B, C))  # A, D, delta_bias stay fp32
    expected = cross_selective_scan_2d_reference(*(t.double() for t in (u, delta, A, B, C, D, bias)), True,
                                                 routes="cross")
    on_gpu = [t.cuda() for t in (u, delta, A, B, C, D, bias)]
    if channels_last:
        on_gpu[0] = on_gpu[0].contiguous(memory_format=torch.channels_last)
    assert cross_rows_launch.cross_forward_design(*on_gpu, CODES, False)[0] == "rs"
    for out_fp32 in (False, True):
        y = kernels.cross_forward(*on_gpu, True, CODES, out_fp32)
        assert y.dtype == (torch.float32 if out_fp32 else dtype) and y.shape == u.shape
        assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert relative_error(y, expected) <= TOLERANCE[torch.float32 if out_fp32 else dtype]
    monkeypatch.setenv(rows_launch.PLAN_ENV, "v3")
    v3 = kernels.cross_forward(*on_gpu, True, CODES, False)
    assert relative_error(v3, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype,side,rank,folds", [(torch.float32, 56, 4, True), (torch.bfloat16, 56, 6, False)])
def test_four_route_forward_with_the_step_size_projection(kernels, dtype, side, rank, folds):
    # The folding kernel where rows_plan.fold_rule folds (fp32, R = 4), project_delta + the unfolded
    # kernel where it does not (bf16 at the tiny model's first-stage rank): both against the fp64
    # reference with the projection. The op passes the weight in the inputs' type (cross_ops).
    from support.rows_cases import cross_fold_inputs

    x = cross_fold_inputs(2, 16, side, side, rank, dtype, seed=rank)
    x["delta_proj_weight"] = x["delta_proj_weight"].to(dtype)
    gpu = {k: (v.cuda() if v is not None else None) for k, v in x.items()}
    names = ("u", "delta", "A", "B", "C", "D", "delta_bias")
    on_gpu = [gpu[n] for n in names]
    assert kernels.cross_folds(*on_gpu, CODES, False, gpu["delta_proj_weight"]) == folds
    expected = cross_selective_scan_2d_reference(*(None if x[n] is None else x[n].double() for n in names), True,
                                                 routes="cross", delta_proj_weight=x["delta_proj_weight"].double())
    y = kernels.cross_forward(*on_gpu, True, CODES, False, gpu["delta_proj_weight"])
    assert relative_error(y, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype,side", [(torch.float32, 56), (torch.bfloat16, 28), (torch.bfloat16, 7)])
def test_four_route_backward_opt_in_agrees_with_v3(kernels, monkeypatch, dtype, side):
    g = torch.Generator().manual_seed(side + 1)
    batch, dim = 2, 8
    u = torch.randn(batch, dim, side, side, generator=g).to(dtype).cuda().contiguous(memory_format=torch.channels_last)
    delta = (torch.randn(batch, 4, dim, side, side, generator=g) * 0.5 - 1.0).to(dtype).cuda()
    B, C = (torch.randn(batch, 4, 1, side, side, generator=g).to(dtype).cuda() for _ in range(2))
    A = -(torch.rand(4 * dim, 1, generator=g) * 1.5 + 0.05).cuda()
    D, bias = torch.randn(4 * dim, generator=g).cuda(), (torch.randn(4 * dim, generator=g) * 0.3).cuda()
    dy = torch.randn(batch, dim, side, side, generator=g).to(dtype).cuda().contiguous(memory_format=torch.channels_last)
    args = (u, delta, A, B, C, D, bias, True, CODES, dy)
    monkeypatch.delenv(scan_plan.BACKWARD_ENV, raising=False)
    v3 = kernels.cross_backward(*args)
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    assert cross_rows_backward.backward_design(u, delta, A, B, C, D, bias, CODES, dy)[0] == "rs"
    rs = kernels.cross_backward(*args)
    assert rs[0].is_contiguous(memory_format=torch.channels_last)
    for name, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias"), rs, v3):
        assert a.shape == b.shape, name
        err = ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
        assert err <= 4 * TOLERANCE[dtype], (name, err)


@pytest.mark.parametrize("dtype,side", [(torch.float32, 56), (torch.bfloat16, 14)])
def test_single_route_backward_opt_in_agrees_with_v3(kernels, monkeypatch, dtype, side):
    x = make_inputs(2, 8, 1, side, side, dtype, seed=side + 2)
    gpu = {k: None if v is None else v.cuda() for k, v in x.items()}
    dy = torch.randn(2, 8, side * side, generator=torch.Generator().manual_seed(side)).to(dtype).cuda()
    args = (gpu["u"], gpu["delta"], gpu["A"], gpu["B"], gpu["C"], gpu["D"], gpu["delta_bias"], True, side, side, dy)
    monkeypatch.delenv(scan_plan.BACKWARD_ENV, raising=False)
    _, carry_h, carry_v = kernels.forward(*args[:10], False, True)
    v3 = kernels.backward(*args, carry_h, carry_v)
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    rs = kernels.backward(*args, carry_h, carry_v)
    for name, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias"), rs, v3):
        assert a.shape == b.shape, name
        err = ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
        assert err <= 4 * TOLERANCE[dtype], (name, err)
