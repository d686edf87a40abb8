"""dev/gpu/check_rows_backward.py --cross on the CPU: its table logic with the RS route passes on the host
emulation and the CPU kernel's backward op in the GPU's places (the script itself runs on a GPU only).
No GPU result is produced."""
from __future__ import annotations

import time

import pytest
import torch

from support.cuda_emulation_build import rows_backward_emulation
from support.script_loading import load_script
from vmamba2d.ops.compiled import rows_backward_launch as rbl
from vmamba2d.ops.compiled.cross_ops import cross_selective_scan_2d_bwd


@pytest.fixture(scope="module")
def check():
    return load_script("dev/gpu/check_rows_backward.py", "check_rows_backward")


def emulated_passes():
    emu = rows_backward_emulation()

    def layout(u, width):
        plan = rbl.backward_plan(u.element_size(), u.element_size(), width)
        return plan.vec, plan.load

    def save_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, route, routes, route_index):
        return emu.rows_forward_save(u, delta, A, B, C, D, delta_bias, softplus, height, width, False, 2,
                                     *layout(u, width), route, False, routes, route_index)[1]

    def backward_pass(u, delta, A, B, C, D, delta_bias, softplus, height, width, dy, carries, route, ddelta_out,
                      du_sum, du_fp32, routes, route_index):
        du, ddelta, dBC, dA, dD, ddb = emu.rows_backward(u, delta, A, B, C, D, delta_bias, softplus, height, width,
                                                          dy, carries, 2, *layout(u, width), route, du_sum, du_fp32,
                                                          routes, route_index)
        mine = lambda t: t.view(t.shape[0], routes, -1)[:, route_index]  # noqa: E731
        mine(ddelta_out).copy_(mine(ddelta))
        return rbl.reduce_partials(du, ddelta_out, dBC, dA, dD, ddb, B.dtype)

    return save_pass, backward_pass


def cpu_backward(u, delta, A, B, C, D, delta_bias, softplus, routes, dy):
    """The CPU kernel's backward op (fp32 / fp64 only: 2-byte inputs widened, as the op's interface does)."""
    widen = lambda t: t.float() if t is not None and t.dtype == torch.bfloat16 else t  # noqa: E731
    return cross_selective_scan_2d_bwd(*(widen(t) for t in (u, delta, A, B, C, D, delta_bias)), softplus, routes,
                                       widen(dy))


def cpu_timer(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def emulated_cross_save(u, delta, A, B, C, D, delta_bias, softplus, height, width):
    plan = rbl.backward_plan(u.element_size(), u.element_size(), width)
    return rows_backward_emulation().rows_cross_save(u, delta, A, B, C, D, delta_bias, softplus, height, width, 2,
                                                     plan.vec, plan.load)


def test_cross_table_agrees_with_the_cpu_backward_op(check):
    lines, ok = check.cross_rows(emulated_passes(), cpu_backward, 2, maps=((9, 3), (7, 4)),
                                 device="cpu", timer=cpu_timer, cross_save=emulated_cross_save)
    rows = [line for line in lines if line.startswith("| 9x9") or line.startswith("| 7x7")]
    assert ok and len(rows) == 4, lines
    assert all(row.split(" | ")[3] == "True" for row in rows)  # bit-equal runs
    assert all(float(row.split(" | ")[2]) < 1e-2 for row in rows)


def test_a_wrong_pass_fails_the_table(check):
    save_pass, backward_pass = emulated_passes()

    def off_by_a_bit(*args):
        grads = backward_pass(*args)
        return (grads[0] * 1.1,) + tuple(grads[1:])

    _, ok = check.cross_rows((save_pass, off_by_a_bit), cpu_backward, 2, maps=((7, 2),),
                             device="cpu", timer=cpu_timer)
    assert not ok
