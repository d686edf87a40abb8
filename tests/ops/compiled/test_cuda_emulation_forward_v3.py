"""The one-state forward's quad placement (quad_anchor / load_quads in csrc/cuda/scan2d_forward.cuh),
emulated on the CPU with the race detector, against the fp64 reference of tests/ops/compiled/test_scan_cuda.py.
"""
from __future__ import annotations

import pytest
import torch

from support.v3_cases import emulated_vector_accesses, make_inputs


def _offset_by(t: torch.Tensor, elements: int) -> torch.Tensor:
    """The same values `elements` elements into their storage (contiguous)."""
    flat = torch.empty(t.numel() + elements, dtype=t.dtype)
    flat[elements:] = t.reshape(-1)
    return flat[elements:].view(t.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_state_forward_loads_every_aligned_whole_quad_as_vectors(dtype):
    # One 32 x 34 map, N = 1, the group's 4 channels in one block (the one-state variant). Rows of
    # 34 cells put the quads of odd map rows at map positions 2 mod 4; u, delta, B, C start two
    # elements into their storage, and a plane is 1088 = 0 mod 4 elements, so exactly the quads of
    # odd rows are aligned in every plane. The load phase moves each of them (B, delta and u of 4
    # channels) as vectors, whatever its map column; the store phase keeps its own test (quads at
    # positions 0 mod 4: the freshly allocated y of even rows). The right tile (2 columns) is
    # scalar throughout.
    batch, dim, height, width = 1, 4, 32, 34
    inputs = make_inputs(batch, dim, 1, 1, height, width, dtype=dtype, seed=31)
    for name in ("u", "delta", "B", "C"):
        inputs[name] = _offset_by(inputs[name], 2)
    half = dtype != torch.float32
    fwd, _ = emulated_vector_accesses(inputs, height, width, rtol=6e-2 if half else 5e-5, order=3,
                                       sm_count=1, out_fp32=half, dy_fp32=half)
    quads_per_row, rows_each = 8, height // 2
    assert fwd == rows_each * quads_per_row * (1 + 2 * dim) + rows_each * quads_per_row * dim
