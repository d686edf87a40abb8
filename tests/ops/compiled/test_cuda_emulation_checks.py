"""The CUDA kernel's CPU-side checker and the properties it proves (no GPU needed).

* the checker itself: synthetic blocks that break one rule each (races between threads of one
  barrier interval, within a warp without __syncwarp, reads of unwritten shared memory,
  out-of-bounds shared / global accesses, barriers where not every thread arrives) must fail, and
  correctly synchronised ones must pass;
* every block barrier of the forward and backward kernels is necessary: leaving any one out
  makes the race detector fail;
* results do not depend on the execution order: forward and backward are bitwise identical under
  forward, reversed and shuffled thread / warp / lane / block order (dB / dC included: they are
  reduced without atomics in a fixed order);
* the tile-parallel forward and backward (few maps) give the sequential passes' results;
* saved carries, empty shapes, and the Python mirror of the kernel's tiling plan.
"""
from __future__ import annotations

import pytest
import torch

from support.v3_cases import EMULATION, ORDER, make_inputs
from vmamba2d.ops.compiled import ops as compiled_ops

PASSING_SCENARIOS = ["ordered_by_barrier", "ordered_by_syncwarp", "aligned_vector_access", "offset_view"]
FAILING_SCENARIOS = {
    "read_after_write_across_warps": "race \\(read after write\\)",
    "read_after_write_in_warp": "race \\(read after write\\)",
    "write_after_read": "race \\(write after read\\)",
    "write_after_write": "race \\(write after write\\)",
    "uninitialised_read": "no thread wrote first",
    "out_of_bounds_shared": "out-of-bounds shared access",
    "out_of_bounds_global": "out-of-bounds global access",
    "barrier_inside_warp_phase": "__syncthreads inside",
    "syncwarp_inside_lane_phase": "__syncwarp outside",
    "misaligned_shared_array": "misaligned shared array",
    "misaligned_vector_load": "misaligned vector global access",
    "out_of_bounds_vector_load": "out-of-bounds vector global access",
    "misaligned_vector_store": "misaligned vector global access",
    "offset_view_past_the_end": "offset view out of bounds",
    "out_of_bounds_through_offset_view": "out-of-bounds global access",
    "offset_view_of_missing_buffer": "offset view of a global buffer the launch did not provide",
}


@pytest.mark.parametrize("scenario", PASSING_SCENARIOS)
def test_checker_accepts_synchronised_blocks(scenario):
    EMULATION._emulation_self_check(scenario)


@pytest.mark.parametrize("scenario", sorted(FAILING_SCENARIOS))
def test_checker_rejects_broken_blocks(scenario):
    with pytest.raises(RuntimeError, match=FAILING_SCENARIOS[scenario]):
        EMULATION._emulation_self_check(scenario)


def _run(height=40, width=40, *, batch=2, dim=2, groups=1, nstate=2, seed=3, **options):
    """Emulated forward (saving carries) and backward; sm_count 1 keeps both channels of the group
    in one backward block, so the per-channel barriers are exercised too."""
    inputs = make_inputs(batch, dim, groups, nstate, height, width, seed=seed)
    args = [inputs[k] for k in ORDER]
    options.setdefault("sm_count", 1)
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, height, width, False, True, **options)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1))
    grads = EMULATION._emulate_backward(*args, True, height, width, dy, carry_h, carry_v, **options)
    return y, carry_h, carry_v, grads


# 40x40 maps = 2x2 tiles, N = 2, 2 channels. Forward (both channels in one block, one state
# round): 2 barriers per tile (after block phase A, after the warps' scans). Backward on a 64 KiB
# device (BACKWARD_DEVICE: one channel per block, 2 sets, so the second set's first barrier orders
# it after the first; with one state round u and dy stay off chip, so on larger devices both
# channels share a block): per set 1 after writing its channels' constants, 2 per tile, 2 around
# the dD / ddelta_bias reduction: 2 * (1 + 4 * 2 + 2).
FORWARD_BARRIERS = range(8)
BACKWARD_BARRIERS = range(22)
BACKWARD_DEVICE = dict(sm_count=1, smem_per_sm=64 * 1024, smem_per_block=64 * 1024)


def test_every_barrier_is_necessary():
    _run()  # intact: no race
    inputs = make_inputs(2, 2, 1, 2, 40, 40, seed=3)
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, 40, 40, False, True, sm_count=1)
    dy = torch.randn_like(y)
    for index in FORWARD_BARRIERS:
        with pytest.raises(RuntimeError, match="race"):
            EMULATION._emulate_forward(*args, True, 40, 40, False, True, drop_barrier=index,
                                         sm_count=1)
    for index in BACKWARD_BARRIERS:
        with pytest.raises(RuntimeError, match="race"):
            EMULATION._emulate_backward(*args, True, 40, 40, dy, carry_h, carry_v,
                                          drop_barrier=index, **BACKWARD_DEVICE)


def test_every_barrier_is_necessary_at_one_state():
    # N = 1, the group's 4 channels in one block (one warp each) in both passes. 2x2 tiles:
    # forward 2 barriers per tile; backward 1 after the channel constants, 2 per tile, 2 around
    # the reduction: 11.
    inputs = make_inputs(2, 4, 1, 1, 40, 40, seed=4)
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, 40, 40, False, True,
                                                       drop_barrier=8, sm_count=1)
    for index in range(8):
        with pytest.raises(RuntimeError, match="race"):
            EMULATION._emulate_forward(*args, True, 40, 40, False, True, drop_barrier=index,
                                         sm_count=1)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    EMULATION._emulate_backward(*args, True, 40, 40, dy, carry_h, carry_v, drop_barrier=11,
                                  sm_count=1)
    for index in range(11):
        with pytest.raises(RuntimeError, match="race"):
            EMULATION._emulate_backward(*args, True, 40, 40, dy, carry_h, carry_v,
                                          drop_barrier=index, sm_count=1)


KIB = 1024
DEVICES = {  # shared memory per SM / per block (opt-in) of real GPUs
    "T4": dict(smem_per_sm=64 * KIB, smem_per_block=64 * KIB),
    "A100": dict(smem_per_sm=164 * KIB, smem_per_block=163 * KIB),
    "H100": dict(smem_per_sm=228 * KIB, smem_per_block=227 * KIB),
}


@pytest.mark.parametrize("device, channels_per_block", [("T4", 4), ("A100", 4), ("H100", 4)])
def test_one_state_backward_blocks_hold_four_channels_where_they_fit(device, channels_per_block):
    # N = 1 backward blocks take ~13 KB of shared memory per channel (3 warp tiles; with one state
    # round dt is recomputed and u and dy are read again in the last phase) + one B tile: 4 channels
    # (128 threads, 55 KB) fit four times on an H100 / H200 SM, twice on an A100 SM and once on a
    # T4 (64 KB), where no smaller block keeps more than those 4 warps resident. Seen in the barrier
    # count of 2x2 tiles: per set of channels 1 after its constants, 2 per tile, 2 around the
    # reduction.
    inputs = make_inputs(2, 4, 1, 1, 40, 40, seed=9)  # 2 maps per channel: 1 slice per group
    args = [inputs[k] for k in ORDER]
    options = dict(sm_count=1, **DEVICES[device])
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, 40, 40, False, True, **options)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(10))
    sets = 4 // channels_per_block
    barriers = sets * 11
    EMULATION._emulate_backward(*args, True, 40, 40, dy, carry_h, carry_v,
                                  drop_barrier=barriers, **options)
    with pytest.raises(RuntimeError, match="race"):
        EMULATION._emulate_backward(*args, True, 40, 40, dy, carry_h, carry_v,
                                      drop_barrier=barriers - 1, **options)


def test_dropping_a_barrier_past_the_last_one_changes_nothing():
    # The drop index counts the barriers a block really executes: the first index past them
    # leaves the run intact, so the ranges above are the kernels' exact barrier counts.
    inputs = make_inputs(2, 2, 1, 2, 40, 40, seed=3)
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = EMULATION._emulate_forward(
        *args, True, 40, 40, False, True, drop_barrier=len(FORWARD_BARRIERS), sm_count=1)
    EMULATION._emulate_backward(*args, True, 40, 40, torch.randn_like(y), carry_h, carry_v,
                                  drop_barrier=len(BACKWARD_BARRIERS), **BACKWARD_DEVICE)


@pytest.mark.parametrize("shape", [(40, 40, 2, 4, 2, 2), (14, 14, 5, 8, 2, 1), (1, 90, 37, 2, 1, 4)],
                         ids=["tiles", "packed-4ch", "1xL"])
def test_results_are_bitwise_identical_in_every_execution_order(shape):
    height, width, batch, dim, groups, nstate = shape
    runs = [
        _run(height, width, batch=batch, dim=dim, groups=groups, nstate=nstate, order=order,
             sm_count=2)
        for order in (0, 1, 2, 11)
    ]
    first = runs[0]
    for other in runs[1:]:
        assert torch.equal(first[0], other[0])
        assert torch.equal(first[1], other[1]) and torch.equal(first[2], other[2])
        for a, b in zip(first[3], other[3]):
            assert (a is None and b is None) or torch.equal(a, b)


def test_tile_parallel_barriers_are_necessary():
    # 70x70 maps = 3x3 tiles, one block per tile, N = 4, 5 channels (a prime group size: one
    # channel per block, on 4 warps, one state round). Forward: the edge passes have 1 barrier
    # per block, the final pass 2 (sm_count 1000: 5 sequential blocks would not fill it).
    # Backward (sm_count 1000): the planner slices the 5 channels into 5 blocks per tile, so a
    # block handles one channel: 1 after the channel's constants, then edge passes 1 barrier, the
    # final pass 2 + 2 around its reduction.
    # (Several channel sets walked by one block -- the barrier between them -- run in the
    # sequential backward: test_every_barrier_is_necessary.)
    inputs = make_inputs(1, 5, 1, 4, 70, 70, seed=6)
    args = [inputs[k] for k in ORDER]
    plan = EMULATION._launch_plan(1, 5, 1, 4, 70, 70, 1000, 164 * 1024, 163 * 1024)
    assert plan["fwd_tile_parallel"] and plan["bwd_tile_parallel"] and plan["bwd_slices"] == 5
    for index in (0, 1):
        with pytest.raises(RuntimeError, match="race"):
            EMULATION._emulate_forward(*args, True, 70, 70, False, True, drop_barrier=index,
                                         sm_count=1000)
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, 70, 70, False, True,
                                                       drop_barrier=2, sm_count=1000)
    dy = torch.randn_like(y)
    for index in range(5):
        with pytest.raises(RuntimeError, match="race"):
            EMULATION._emulate_backward(*args, True, 70, 70, dy, carry_h, carry_v,
                                          drop_barrier=index, sm_count=1000)
    EMULATION._emulate_backward(*args, True, 70, 70, dy, carry_h, carry_v, drop_barrier=5,
                                  sm_count=1000)


@pytest.mark.parametrize("shape", [(1, 1, 16, 70, 90), (2, 2, 4, 40, 70), (1, 2, 2, 1, 300),
                                   (1, 2, 3, 200, 1), (3, 2, 2, 33, 65)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tile_parallel_forward_matches_sequential_forward(shape):
    batch, dim, nstate, height, width = shape
    inputs = make_inputs(batch, dim, 1, nstate, height, width, seed=sum(shape))
    args = [inputs[k] for k in ORDER]
    seq = EMULATION._emulate_forward(*args, True, height, width, False, True, sm_count=1)
    par = EMULATION._emulate_forward(*args, True, height, width, False, True, sm_count=1000,
                                       order=5)
    # Same carries and y up to the rounding of the regrouped sums (edge + decay * carry).
    for name, a, b in zip(("y", "carry_h", "carry_v"), seq, par):
        assert a.shape == b.shape, name
        if a.numel():
            scale = a.abs().max().item() + 1e-12
            assert (a - b).abs().max().item() <= 1e-5 * scale, name


@pytest.mark.parametrize("shape", [(1, 1, 16, 70, 90), (2, 2, 2, 40, 70), (1, 2, 3, 200, 1),
                                   (1, 4, 1, 40, 70)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tile_parallel_backward_matches_sequential_backward(shape):
    batch, dim, nstate, height, width = shape
    inputs = make_inputs(batch, dim, 1, nstate, height, width, seed=sum(shape))
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, height, width, False, True)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    seq = EMULATION._emulate_backward(*args, True, height, width, dy, carry_h, carry_v, sm_count=1)
    par = EMULATION._emulate_backward(*args, True, height, width, dy, carry_h, carry_v,
                                        sm_count=1000, order=6)
    for name, a, b in zip(ORDER, seq, par):
        scale = a.abs().max().item() + 1e-12
        assert (a - b).abs().max().item() <= 2e-5 * scale, name


def test_backward_from_saved_carries_equals_backward_that_records_them():
    inputs = make_inputs(2, 4, 2, 3, 45, 70, seed=8)
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, 45, 70, False, True)
    y_plain, none_h, none_v = EMULATION._emulate_forward(*args, True, 45, 70, False, False)
    assert torch.equal(y, y_plain)
    assert none_h.numel() == 0 and none_v.numel() == 0
    dy = torch.randn_like(y)
    saved = EMULATION._emulate_backward(*args, True, 45, 70, dy, carry_h, carry_v, order=4)
    empty = torch.empty(0)
    recorded = EMULATION._emulate_backward(*args, True, 45, 70, dy, empty, empty, order=5)
    for a, b in zip(saved, recorded):
        assert torch.equal(a, b)


def test_backward_rejects_carries_of_the_wrong_size():
    inputs = make_inputs(1, 2, 1, 2, 40, 40, seed=2)
    args = [inputs[k] for k in ORDER]
    dy = torch.randn(1, 2, 1600)
    bad = torch.zeros(7)
    with pytest.raises(ValueError, match="carry_h / carry_v must hold"):
        EMULATION._emulate_backward(*args, True, 40, 40, dy, bad, bad)


@pytest.mark.parametrize("batch,dim", [(0, 4), (2, 0), (0, 0)])
def test_empty_shapes_return_empty_outputs_and_zero_gradients(batch, dim):
    groups = 2 if dim else 1
    inputs = make_inputs(batch, dim, groups, 3, 40, 40, seed=1)
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = EMULATION._emulate_forward(*args, True, 40, 40, False, True)
    assert y.shape == (batch, dim, 1600) and carry_h.numel() == 0 and carry_v.numel() == 0
    dy = torch.zeros(batch, dim, 1600)
    grads = EMULATION._emulate_backward(*args, True, 40, 40, dy, carry_h, carry_v)
    for name, grad, given in zip(ORDER, grads, args):
        assert grad.shape == given.shape, name
        assert not grad.any(), name


@pytest.mark.parametrize("shape", [(3, 2, 4, 40, 70), (37, 2, 2, 1, 100), (5, 3, 1, 7, 7),
                                   (2, 1, 16, 33, 65), (3, 2, 3, 100, 1), (1, 1, 1, 32, 33)])
def test_python_carry_size_mirrors_the_kernel_plan(shape):
    batch, dim, nstate, height, width = shape
    inputs = make_inputs(batch, dim, 1, nstate, height, width, seed=0)
    args = [inputs[k] for k in ORDER]
    _, carry_h, carry_v = EMULATION._emulate_forward(*args, True, height, width, False, True,
                                                       race_check=False)
    expected = compiled_ops.cuda_carry_numel(batch, dim, nstate, height, width)
    assert carry_h.numel() == expected and carry_v.numel() == expected


def test_custom_ops_with_carries_pass_opcheck():
    inputs = make_inputs(1, 4, 2, 2, 3, 4, seed=41)
    args = [inputs[k] for k in ORDER]
    torch.library.opcheck(compiled_ops.selective_scan_2d_fwd, (*args, True, 3, 4, False, True),
                          test_utils=("test_schema", "test_faketensor"))
    empty = torch.empty(0)
    torch.library.opcheck(compiled_ops.selective_scan_2d_bwd,
                          (*args, True, 3, 4, torch.randn(1, 4, 12), empty, empty),
                          test_utils=("test_schema", "test_faketensor"))
