"""The four-route v4 forward with folded step sizes (CrossRowsForward's kFold in
csrc/cuda/scan2d_rows.cuh: the kernel reads the low-rank delta (batch, 4, R, H, W) and the fp32
weight (4, dim, R) and forms each channel's step sizes of a row itself) on the host emulation --
warps and lanes in shuffled orders, every global access bounds-, alignment- and race-checked --
against the fp64 four-route reference with the projection (vmamba2d.ops.cross_selective_scan_2d_reference
with delta_proj_weight: an einsum in fp64, then the scans).
"""
from __future__ import annotations

import pytest
import torch

from support.cuda_emulation_build import rows_emulation
from support.rows_cases import assert_wide_lanes_agree, cross_fold_inputs
from vmamba2d.ops import cross_selective_scan_2d_reference
from vmamba2d.ops.compiled.rows_plan import cross_plan

# Largest |y - reference| / max |reference| per y type, as for the unfolded kernel
# (test_cuda_emulation_rows_cross.py): the fold sums the rank terms in fp32 where the reference sums
# them in fp64, well inside these.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.4e-2}


@pytest.fixture(scope="module")
def rows():
    return rows_emulation()


def run(rows, x, y_fp32=False, order=2, vec=None, load=None, softplus=True, weight="x"):
    """y (batch, dim, H, W) of the emulated folding kernel (the plan cross_plan gives unless vec / load
    are given); weight: the delta_proj_weight passed ("x": the inputs')."""
    batch, dim, height, width = x["u"].shape
    if vec is None:
        plan = cross_plan(x["u"].element_size(), 4 if y_fp32 else x["u"].element_size(), width)
        vec, load = plan.vec, plan.load
    load = vec if load is None else load
    length = height * width
    rank = x["delta"].shape[2]
    y = rows.rows_cross_forward(
        x["u"].reshape(batch, dim, length), x["delta"].reshape(batch, 4 * rank, length), x["A"],
        x["B"].reshape(batch, 4, 1, length), x["C"].reshape(batch, 4, 1, length), x["D"], x["delta_bias"], softplus,
        height, width, y_fp32, order, vec, load, delta_proj_weight=x["delta_proj_weight"] if weight == "x" else weight)
    return y.reshape(batch, dim, height, width)


def reference(x, softplus=True):
    d = {k: (None if v is None else v.double()) for k, v in x.items()}
    return cross_selective_scan_2d_reference(d["u"], d["delta"], d["A"], d["B"], d["C"], d["D"], d["delta_bias"],
                                             softplus, routes="cross", delta_proj_weight=d["delta_proj_weight"])


def check(y, expected, y_type):
    assert not torch.isnan(y).any()
    err = ((y.double() - expected).abs().max() / expected.abs().max()).item()
    assert err <= TOLERANCE[y_type], f"relative error {err:.3g} > {TOLERANCE[y_type]}"


# (H, W, R, dtype): the model's maps with the models' ranks at them (tiny / small: 6, 12, 24, 48; R = 1
# and 48 beside), odd and non-square maps, each input type.
CASES = [
    (56, 56, 6, torch.bfloat16), (56, 56, 1, torch.float32), (28, 28, 12, torch.float16),
    (28, 28, 6, torch.float32), (14, 14, 48, torch.bfloat16), (14, 14, 12, torch.float32),
    (7, 7, 48, torch.float32), (7, 7, 6, torch.float16), (7, 7, 12, torch.bfloat16), (9, 13, 6, torch.float32),
    (5, 28, 1, torch.bfloat16), (31, 3, 12, torch.float16), (1, 1, 6, torch.float32), (6, 64, 12, torch.float32),
]


@pytest.mark.parametrize("height,width,rank,dtype", CASES)
def test_folded_four_routes_against_the_reference(rows, height, width, rank, dtype):
    batch, dim = (1, 2) if height * width > 1000 else (2, 3)
    x = cross_fold_inputs(batch, dim, height, width, rank, dtype, seed=height * 31 + width + rank)
    check(run(rows, x), reference(x), dtype)
    # the model widths run the instance compiled for the plan's scan steps, as the GPU entry does
    plan = cross_plan(x["u"].element_size(), x["u"].element_size(), width)
    if width in (56, 28, 14, 7):
        assert rows.rows_last_steps() == plan.scan_steps


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_output_of_half_inputs(rows, dtype):
    x = cross_fold_inputs(2, 3, 14, 28, 6, dtype, seed=5)
    y = run(rows, x, y_fp32=True)
    assert y.dtype == torch.float32
    # the reference takes the same rounded inputs: an fp32 y is as close as the fp32 kernel's
    check(y, reference(x), torch.float32)


@pytest.mark.parametrize("use_d,use_bias,softplus", [(False, False, False), (False, True, True), (True, False, True),
                                                     (True, True, False)])
def test_without_d_bias_or_softplus(rows, use_d, use_bias, softplus):
    x = cross_fold_inputs(2, 3, 8, 10, 6, torch.float32, seed=3, use_d=use_d, use_bias=use_bias, softplus=softplus)
    check(run(rows, x, softplus=softplus), reference(x, softplus=softplus), torch.float32)


@pytest.mark.parametrize("vec,load", [(1, 1), (2, 1), (2, 2), (4, 1), (4, 4)])
def test_every_lane_width(rows, vec, load):
    x = cross_fold_inputs(2, 5, 6, 12, 5, torch.float32, seed=11)
    check(run(rows, x, vec=vec, load=load), reference(x), torch.float32)


@pytest.mark.parametrize("dtype,side,rank", [(torch.float32, 14, 6), (torch.bfloat16, 28, 12), (torch.float16, 7, 5)])
def test_warp_and_lane_order_do_not_change_a_bit(rows, dtype, side, rank):
    x = cross_fold_inputs(3, 5, side, side, rank, dtype, seed=8)
    first = run(rows, x, order=0)
    for order in (1, 2, 3, 17):
        assert torch.equal(run(rows, x, order=order), first)


# Widths 4 divides (the model's 56 / 28, few lanes, odd multiples of 4, 31 lanes) at V = 4: the plan of
# fp16 / bf16 there (fp32 run at 4 too), y in the input type and fp32, ranks 1 (odd plane only), 4 (the
# two-plane loop only) and 7 (both).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width,rank", [(56, 6), (28, 7), (8, 1), (12, 4), (20, 7), (60, 1), (124, 4)])
def test_four_columns_a_lane(rows, dtype, width, rank):
    x = cross_fold_inputs(2, 3, 3 if width > 28 else 5, width, rank, dtype, seed=width + rank)
    expected = reference(x)
    if dtype != torch.float32:
        assert cross_plan(2, 2, width).vec == 4
    assert_wide_lanes_agree(run, check, rows, x, expected, dtype, vec=4)


# Two columns a lane in fp16 / bf16 with the scan steps compiled in: widths 4 does not divide with 15
# and 27 lanes a map (4 and 5 steps), the folding instances a launch takes there (rank 1 folds in 2-byte
# types); the model's 56 / 28 take 4 columns since the lane rule changed.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("width,rank", [(30, 1), (54, 1), (54, 3)])
def test_two_columns_a_lane_in_half_types(rows, dtype, width, rank):
    plan = cross_plan(2, 2, width)
    assert (plan.vec, plan.load, plan.scan_steps) == (2, 2, 4 if width == 30 else 5)
    x = cross_fold_inputs(2, 3, 4, width, rank, dtype, seed=width + rank)
    assert_wide_lanes_agree(run, check, rows, x, reference(x), dtype, vec=2)


@pytest.mark.parametrize("dtype,side", [(torch.float32, 14), (torch.bfloat16, 14), (torch.bfloat16, 28)])
def test_unit_projection_is_bit_equal_to_the_unfolded_kernel(rows, dtype, side):
    # A property, not a comparison with the code's own output: with weights (1, 0, ..) each channel's
    # step sizes are exactly plane 0 of its route (fp32 FMAs: 1 * x + 0 = x, 0 * y adds +0), so the
    # folded kernel must give the unfolded kernel's y bit for bit on that plane broadcast to every
    # channel.
    # (bf16 at 28: V = 4.)
    x = cross_fold_inputs(2, 3, side, side, 3, dtype, seed=4)
    weight = torch.zeros(4, 3, 3)
    weight[..., 0] = 1.0
    folded = run(rows, x, weight=weight)
    full = x["delta"][:, :, :1].expand(-1, -1, 3, -1, -1).contiguous()
    plan = cross_plan(x["u"].element_size(), x["u"].element_size(), side)
    cells = side * side
    y = rows.rows_cross_forward(
        x["u"].reshape(2, 3, cells), full.reshape(2, 12, cells), x["A"], x["B"].reshape(2, 4, 1, cells),
        x["C"].reshape(2, 4, 1, cells), x["D"], x["delta_bias"], True, side, side, False, 2, plan.vec, plan.load)
    assert torch.equal(folded, y.reshape(2, 3, side, side))


def test_bad_weight_or_delta_is_named(rows):
    x = cross_fold_inputs(1, 3, 4, 8, 6, torch.float32, seed=1)
    with pytest.raises(RuntimeError, match="delta_proj_weight: expected a contiguous CPU float32"):
        run(rows, x, weight=x["delta_proj_weight"].half())
    with pytest.raises(RuntimeError, match=r"delta_proj_weight: expected \(4, dim, R\) with dim = 3"):
        run(rows, x, weight=torch.randn(4, 4, 6))
    with pytest.raises(RuntimeError, match=r"delta: with delta_proj_weight, expected the low-rank \(batch, 4 \* R"):
        run(rows, x, weight=torch.randn(4, 3, 5))  # R = 5 against a delta of rank 6
    with pytest.raises(RuntimeError, match="delta: with delta_proj_weight"):
        run(rows, dict(x, delta=x["delta"].half()))


def test_misaligned_low_rank_delta_is_caught(rows):
    # The low-rank planes are read with the plan's vectors: a delta off the vector boundary fails
    # the emulation's alignment check (it would fault on a GPU); scalar accesses take it.
    x = cross_fold_inputs(1, 2, 4, 8, 3, torch.float32, seed=2)
    low = torch.empty(x["delta"].numel() + 1)[1:].reshape(x["delta"].shape)
    low.copy_(x["delta"])
    x["delta"] = low
    with pytest.raises(RuntimeError, match="misaligned"):
        run(rows, x, vec=2, load=2)
    check(run(rows, x, vec=2, load=1), reference(x), torch.float32)
