"""How the compiled kernels take their inputs: the dtypes each device's kernel computes in, and
contiguous copies in them (shared by the single-route and the four-route ops)."""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def kernel_dtypes(u: Tensor, delta: Tensor, B: Tensor, C: Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(scan dtype for u / delta / B / C, dtype for A / D / delta_bias) that the kernel of u's
    device takes: the CPU kernel computes in fp32 (fp64 for fp64 inputs); the CUDA kernel takes
    fp32 / fp16 / bf16 scan inputs with fp32 parameters (TypeError for anything else)."""
    common = torch.promote_types(torch.promote_types(u.dtype, delta.dtype), torch.promote_types(B.dtype, C.dtype))
    if u.device.type == "cpu":
        compute = torch.float64 if common == torch.float64 else torch.float32
        return compute, compute
    if common != torch.float32 and common != torch.float16 and common != torch.bfloat16:
        raise TypeError(
            f"the cuda 2D scan kernel takes float32, float16 or bfloat16 inputs, got {common}; "
            "use backend='torch' for float64"
        )
    return common, torch.float32


def contiguous_as(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """t in ``dtype``, contiguous (None stays None)."""
    return None if t is None else t.to(dtype).contiguous()
