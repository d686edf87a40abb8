"""The CUDA backward's per-quad vector decision, emulated on the CPU (no GPU needed).

A backward block phase moves all the planes of a quad together: one vector access each when every
plane it touches there is aligned (scan2d_backward.cuh, vector_at), else one scalar access per
cell. tests/ops/compiled/test_scan_cuda.py misaligns u / delta / B / C together, so the first plane tested
decides; here only dy -- a later plane of the decision -- is off alignment. The emulation fails on
any misaligned vector access, its race detector is on, and the gradients are compared with the
independent fp64 reference of tests/ops/compiled/test_scan_cuda.py.
"""
from __future__ import annotations

import pytest
import torch

from support.v3_cases import (EMULATION, ORDER, offset_by_one, assert_close, emulated_bwd, emulated_fwd,
                            make_inputs, reference)

SIDE = 32  # one tile per map: with aligned planes every quad would be one vector access


@pytest.mark.parametrize("dtype, dy_dtype", [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float32),  # fp32 dy with 2-byte inputs: the decision's other dy view
], ids=str)
def test_backward_takes_the_per_cell_path_when_only_dy_is_misaligned(dtype, dy_dtype):
    batch, dim = 1, 4  # N = 1, the group's 4 channels in one block: the one-state variant
    inputs = make_inputs(batch, dim, 1, 1, SIDE, SIDE, dtype=dtype, seed=41)
    args = [inputs[k] for k in ORDER]
    options = dict(order=2, race_check=True, sm_count=1)
    y, carry_h, carry_v = emulated_fwd(*args, True, SIDE, SIDE, False, True, **options)
    assert EMULATION._emulation_vector_accesses() > 0  # aligned inputs: the forward's quads are vectors
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(42)).to(dy_dtype)
    dy_off = offset_by_one(dy)
    assert dy_off.is_contiguous() and dy_off.storage_offset() == 1 and torch.equal(dy_off, dy)
    grads = emulated_bwd(*args, True, SIDE, SIDE, dy_off, carry_h, carry_v, **options)
    assert EMULATION._emulation_vector_accesses() == 0
    _, grads_ref = reference(inputs, dy, SIDE, SIDE)
    rtol = 5e-5 if dtype == torch.float32 else 6e-2
    for name, got, ref in zip(ORDER, grads, grads_ref):
        assert_close("d" + name, got, ref, rtol)


@pytest.mark.parametrize("dtype, dy_dtype", [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float32),
], ids=str)
def test_tile_parallel_backward_passes_take_vector_quads(dtype, dy_dtype):
    # 40 x 64 (2 x 2 tiles, rows of whole quads; the bottom tiles' padding rows are not), N = 2 on
    # one channel, on an H100: the backward runs its tiles in parallel, so its passes before the
    # final one (which make no gradients, only carries) take the vector decision too.
    height, width = 40, 64
    h100 = dict(sm_count=132, smem_per_sm=228 * 1024, smem_per_block=227 * 1024)
    plan = EMULATION._launch_plan(1, 1, 1, 2, height, width, **h100)
    assert plan["bwd_tile_parallel"] and plan["bwd_variant"] == "kGeneral"
    inputs = make_inputs(1, 1, 1, 2, height, width, dtype=dtype, seed=43)
    args = [inputs[k] for k in ORDER]
    options = dict(order=3, race_check=True, **h100)
    y, carry_h, carry_v = emulated_fwd(*args, True, height, width, False, True, **options)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(44)).to(dy_dtype)
    grads = emulated_bwd(*args, True, height, width, dy, carry_h, carry_v, **options)
    assert EMULATION._emulation_vector_accesses() > 0
    _, grads_ref = reference(inputs, dy, height, width)
    rtol = 5e-5 if dtype == torch.float32 else 6e-2
    for name, got, ref in zip(ORDER, grads, grads_ref):
        assert_close("d" + name, got, ref, rtol)
