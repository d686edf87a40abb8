#!/usr/bin/env python3
"""GPU smoke test of Triton's reverse associative scan, the primitive the Triton scan kernels'
backward relies on (Triton's ``tl.associative_scan(..., reverse=True)`` has an open upstream bug
report for multi-dimensional blocks).

A 4-D block (2 x 2 x 8 x 32) of first-order linear recurrences h[i] = a[i] * h[i+1] + x[i] is
scanned backwards along each axis with 4 and 8 warps and compared with a float64 Python loop.
Exit status: 0 all agree, 1 a mismatch (printed), 2 no GPU or no Triton here.

    python3 dev/gpu/triton_reverse_scan_smoke.py
"""
from __future__ import annotations

import itertools
import sys

import torch

SHAPE = (2, 2, 8, 32)
WARPS = (4, 8)
TOLERANCE = 1e-5


def reference(a: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    """h[i] = a[i] * h[i+1] + x[i] along ``axis``, from the last element backwards (float64 loop)."""
    a64, x64 = a.double().movedim(axis, -1).cpu(), x.double().movedim(axis, -1).cpu()
    h = torch.empty_like(x64)
    carry = torch.zeros(x64.shape[:-1], dtype=torch.float64)
    for i in range(x64.shape[-1] - 1, -1, -1):
        carry = a64[..., i] * carry + x64[..., i]
        h[..., i] = carry
    return h.movedim(-1, axis)


try:
    import triton
    import triton.language as tl
except ImportError as import_error:
    triton = None
    TRITON_MISSING = str(import_error)
else:
    TRITON_MISSING = ""

    @triton.jit
    def _step_then_step(decay_first, value_first, decay_then, value_then):
        # In the reverse scan the first operand is the later, already scanned part (applied first).
        return decay_first * decay_then, decay_then * value_first + value_then

    @triton.jit
    def _reverse_scan_kernel(a_ptr, x_ptr, out_ptr, AXIS: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr,
                             S2: tl.constexpr, S3: tl.constexpr):
        i0 = tl.arange(0, S0)[:, None, None, None]
        i1 = tl.arange(0, S1)[None, :, None, None]
        i2 = tl.arange(0, S2)[None, None, :, None]
        i3 = tl.arange(0, S3)[None, None, None, :]
        offsets = ((i0 * S1 + i1) * S2 + i2) * S3 + i3
        a = tl.load(a_ptr + offsets)
        x = tl.load(x_ptr + offsets)
        _, h = tl.associative_scan((a, x), AXIS, _step_then_step, reverse=True)
        tl.store(out_ptr + offsets, h)


def main() -> int:
    if not torch.cuda.is_available():
        print("triton_reverse_scan_smoke: no GPU")
        return 2
    if triton is None:
        print(f"triton_reverse_scan_smoke: triton is not importable ({TRITON_MISSING})")
        return 2
    generator = torch.Generator().manual_seed(0)
    a = (torch.rand(SHAPE, generator=generator) * 0.9 + 0.05).cuda()
    x = torch.randn(SHAPE, generator=generator).cuda()
    failures = 0
    for axis, warps in itertools.product(range(len(SHAPE)), WARPS):
        out = torch.empty_like(x)
        _reverse_scan_kernel[(1,)](a, x, out, axis, *SHAPE, num_warps=warps)
        torch.cuda.synchronize()
        error = (out.double().cpu() - reference(a, x, axis)).abs().max().item()
        ok = error <= TOLERANCE
        failures += not ok
        print(f"axis {axis}, {warps} warps: max |error| {error:.2e} {'ok' if ok else 'MISMATCH'}")
    print(f"triton {triton.__version__}: {'all agree' if not failures else f'{failures} mismatch(es)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
