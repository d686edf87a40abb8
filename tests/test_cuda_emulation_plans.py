"""The CUDA kernel's work split on every GPU class it is built for, emulated on the CPU.

The launch plan depends on the device: SM count (tile-parallel or sequential walk of a map's
tiles) and shared memory per block / per SM (channels and warps per block in the forward and
backward). Each plan runs different kernel code paths, so every (device, plan) pair runs the
emulated kernel with the race detector on and a shuffled execution order, for the inference
forward (no saved carries), the training forward (saved carries) and the backward, against the
independent fp64 reference of tests/test_scan_cuda.py.
"""
from __future__ import annotations

import pytest
import torch

from test_scan_cuda import (CUDA_MODULE, ORDER, assert_close, check_all, emulated_bwd,
                            emulated_fwd, make_inputs, needs_module, reference)

KIB = 1024
# Opt-in shared memory per block and shared memory per SM, as the devices report them
# (cudaDevAttrMaxSharedMemoryPerBlockOptin / PerMultiprocessor), and their SM counts.
DEVICES = {
    "sm75-T4": dict(sm_count=40, smem_per_block=64 * KIB, smem_per_sm=64 * KIB),
    "sm86-RTX3090": dict(sm_count=82, smem_per_block=99 * KIB, smem_per_sm=100 * KIB),
    "sm80-A100": dict(sm_count=108, smem_per_block=163 * KIB, smem_per_sm=164 * KIB),
    "sm90-H100": dict(sm_count=132, smem_per_block=227 * KIB, smem_per_sm=228 * KIB),
}
# sequential: one SM, so each block walks its map's tiles in order (carries in shared memory);
# tile-parallel: the device's SM count, more than these few maps fill, so the tiles of a map run
# in parallel with carry scans between the passes.
PLANS = ("sequential", "tile-parallel")
# (batch, dim, groups, N, height, width, dtype): several tiles with partial edges each, so both
# plans differ; N = 1 with 4 channels per group (several channels per block), N = 2 and 16 (warps
# split the states; the smaller devices take fewer channels / warps per block), N = 64.
SHAPES = [
    (1, 8, 2, 1, 40, 45, torch.float32),
    (3, 4, 1, 2, 33, 40, torch.bfloat16),
    (1, 2, 1, 16, 35, 33, torch.float16),
    (1, 1, 1, 64, 33, 34, torch.float32),
]


def _options(device: str, plan: str, order: int) -> dict:
    limits = dict(DEVICES[device])
    if plan == "sequential":
        limits["sm_count"] = 1
    return dict(limits, order=order, race_check=True)


def _shape_id(shape) -> str:
    return "x".join(map(str, shape[:-1])) + "-" + str(shape[-1]).replace("torch.", "")


@needs_module
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("device", list(DEVICES))
def test_every_device_plan_matches_reference(device, plan, shape):
    batch, dim, groups, nstate, height, width, dtype = shape
    seed = list(DEVICES).index(device) * 10 + SHAPES.index(shape)
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, seed=seed)
    half = dtype != torch.float32
    rtol = 3e-2 if half else 5e-5
    args = [inputs[k] for k in ORDER]

    # Inference: no carries saved (the path a torch.no_grad() forward takes).
    y_infer, carry_h, carry_v = emulated_fwd(*args, True, height, width, half, False,
                                             **_options(device, plan, order=2 + seed))
    assert carry_h.numel() == 0 and carry_v.numel() == 0
    dy = torch.zeros(y_infer.shape, dtype=y_infer.dtype)
    y_ref, _ = reference(inputs, dy, height, width)
    assert_close("y (inference)", y_infer, y_ref, rtol)

    # Training: forward saving the tile carries, backward from them, in another shuffled order.
    y_train, _ = check_all(emulated_fwd, emulated_bwd, inputs, height, width, rtol=rtol,
                           dy_fp32=half, out_fp32=half, **_options(device, plan, order=100 + seed))
    # Saving carries does not change the arithmetic: both forwards agree to the bit.
    assert torch.equal(y_infer, y_train)


@needs_module
@pytest.mark.parametrize("limits, message", [
    (dict(smem_per_block=32 * KIB), "smem_per_block must be >= 48 KiB"),
    (dict(smem_per_block=100 * KIB, smem_per_sm=64 * KIB), r"smem_per_sm \(65536\) must be >= smem_per_block"),
    (dict(sm_count=0), "sm_count must be >= 1"),
])
def test_emulated_device_limits_are_validated(limits, message):
    inputs = make_inputs(1, 1, 1, 1, 4, 4)
    with pytest.raises(ValueError, match=message):
        CUDA_MODULE._emulate_forward(*(inputs[k] for k in ORDER), True, 4, 4, False, False, **limits)


@needs_module
def test_kernel_rejects_unsupported_dtypes_by_name():
    inputs = {k: (v.double() if v is not None else None)
              for k, v in make_inputs(1, 1, 1, 1, 4, 4).items()}
    with pytest.raises(TypeError, match="float32, float16 or bfloat16, got Double"):
        CUDA_MODULE._emulate_forward(*(inputs[k] for k in ORDER), True, 4, 4, False, False)
