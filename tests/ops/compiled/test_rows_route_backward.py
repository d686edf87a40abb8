"""The single-route op's RS backward (vmamba2d/ops/compiled/rows_route_backward.py) without a GPU: the
design (the VMAMBA2D_SCAN_BACKWARD opt-in, the rule, the tensors the launchers take) and the launches
it makes -- the saving forward of the op's route, then the RS backward reading its carries -- on a
recording driver. The kernels' numerics are the emulation's (test_rows_backward_emulation.py)."""
from __future__ import annotations

import ctypes

import pytest
import torch

from support.rows_cases import make_inputs
from vmamba2d.ops import plan as scan_plan
from vmamba2d.ops.compiled import nvrtc, rows_launch
from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops.compiled.rows_route_backward import backward_design, launch_backward

NAMES = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def _args(x, height, width, dy):
    return (*(x[k] for k in NAMES), height, width, dy)


def test_v3_unless_opted_in(monkeypatch):
    x = make_inputs(2, 3, 1, 9, 14, torch.bfloat16, seed=1)
    dy = torch.zeros(2, 3, 126, dtype=torch.bfloat16)
    monkeypatch.delenv(scan_plan.BACKWARD_ENV, raising=False)
    design, why = backward_design(*_args(x, 9, 14, dy))
    assert design == "v3" and "VMAMBA2D_SCAN_BACKWARD unset or v3" in why
    assert launch_backward(None, *(x[k] for k in NAMES), True, 9, 14, dy) is None  # nothing launched
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    assert backward_design(*_args(x, 9, 14, dy)) == ("rs", "RS: backward at N = 1, 2D routes, width 14 <= 128")
    assert backward_design(*_args(x, 9, 14, dy.float()))[0] == "rs"
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "fast")
    with pytest.raises(ValueError, match="VMAMBA2D_SCAN_BACKWARD"):
        backward_design(*_args(x, 9, 14, dy))


@pytest.mark.parametrize("change,reason", [
    (lambda x: x.update(B=x["B"].expand(-1, -1, 2, -1), C=x["C"].expand(-1, -1, 2, -1)), "N = 2"),
    (lambda x: x.update(u=x["u"].double()), "mixed types"),
    (lambda x: x.update(D=x["D"].double()), "not what the RS launchers take"),
    (lambda x: x.update(delta=x["delta"].transpose(1, 2).contiguous().transpose(1, 2)), "not what the RS launchers"),
])
def test_falls_to_v3_with_the_reason(monkeypatch, change, reason):
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    x = make_inputs(1, 2, 1, 6, 10, torch.float32, seed=2)
    change(x)
    dy = torch.zeros(x["u"].shape, dtype=x["u"].dtype)
    design, why = backward_design(*_args(x, 6, 10, dy))
    assert design == "v3" and reason in why, why


def test_a_row_wider_than_the_backward_takes_v3(monkeypatch):
    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    x = make_inputs(1, 2, 1, 2, 130, torch.float32, seed=3)
    design, why = backward_design(*_args(x, 2, 130, torch.zeros(1, 2, 260)))
    assert design == "v3" and "width 130 > 128" in why


try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable:
    TOOLCHAIN = None


@pytest.mark.skipif(TOOLCHAIN is None, reason="no NVRTC toolchain")
def test_launches_the_saving_forward_then_the_backward_on_its_carries(monkeypatch, tmp_path):
    from support.nvrtc_recording import recording_launcher, stub_kernel

    monkeypatch.setenv(scan_plan.BACKWARD_ENV, "auto")
    launcher, driver = recording_launcher(tmp_path, TOOLCHAIN)
    x = make_inputs(2, 3, 1, 17, 28, torch.bfloat16, seed=4)
    dy = torch.randn(2, 3, 17 * 28).float()
    plan = rbl.backward_plan(2, 4, 28)
    save, backward = rbl.save_spec(plan, torch.bfloat16, 0), rbl.backward_spec(plan, torch.bfloat16, 0)
    stub_kernel(tmp_path, save, TOOLCHAIN)
    stub_kernel(tmp_path, backward, TOOLCHAIN)
    monkeypatch.setattr(torch.cuda, "device", lambda device: _NoDevice())
    launched = []
    real_launch = launcher.launch

    def launch(spec, grid, block, smem, params):
        launched.append((spec.name, params))
        return real_launch(spec, grid, block, smem, params)

    monkeypatch.setattr(launcher, "launch", launch)
    grads = launch_backward(launcher, *(x[k] for k in NAMES), True, 17, 28, dy)
    assert [name for name, _ in launched] == [save.name, backward.name]
    f = rows_launch.RowsParams.from_buffer_copy(launched[0][1][0])
    carries = ctypes.c_void_p.from_buffer_copy(launched[0][1][1]).value
    p = rbl.RowsBackwardParams.from_buffer_copy(launched[1][1][0])
    assert f.y is None and (f.dim, f.groups, f.from_bottom) == (3, 1, 0)
    assert p.carries == carries and (p.u, p.dy, p.dy_fp32, p.du_sum, p.du_fp32) == (
        x["u"].data_ptr(), dy.data_ptr(), 1, None, 0)
    du, ddelta, dA, dB, dC, dD, ddb = grads
    assert du.dtype == torch.bfloat16 and du.shape == x["u"].shape and ddelta.shape == x["delta"].shape
    assert dA.shape == (3, 1) and dB.shape == x["B"].shape and dD.shape == (3,) and ddb.shape == (3,)


class _NoDevice:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
