"""The autograd formula of the single-route scan kernel ops (compiled/ops.py and triton/ops.py).

Both backends define a forward op ``(u, delta, A, B, C, D?, delta_bias?, delta_softplus, height,
width, out_fp32, save_carries) -> (y, carry_1, carry_2)`` and a backward op taking the same inputs
(without out_fp32 / save_carries) plus dy and the two carries. The forward's carries are buffers
for the backward, not outputs with gradients; the backward op recomputes everything else from the
saved inputs.
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def register_single_route_autograd(forward_op, backward_op) -> None:
    """Give ``forward_op`` (a ``torch.library`` custom op) its autograd formula through ``backward_op``."""

    def setup_context(ctx, inputs, output) -> None:
        u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, _, _ = inputs
        _, carry_1, carry_2 = output
        ctx.mark_non_differentiable(carry_1, carry_2)
        ctx.save_for_backward(u, delta, A, B, C, D, delta_bias, carry_1, carry_2)
        ctx.scan_args = (delta_softplus, height, width)

    def backward(ctx, dy: Tensor, _dcarry_1: Tensor, _dcarry_2: Tensor):
        u, delta, A, B, C, D, delta_bias, carry_1, carry_2 = ctx.saved_tensors
        du, ddelta, dA, dB, dC, dD, dbias = backward_op(
            u, delta, A, B, C, D, delta_bias, *ctx.scan_args, dy.contiguous(), carry_1, carry_2
        )
        return (
            du, ddelta, dA, dB, dC,
            dD if D is not None else None,
            dbias if delta_bias is not None else None,
            None, None, None, None, None,
        )

    forward_op.register_autograd(backward, setup_context=setup_context)


def backward_fake(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor],
                  delta_bias: Optional[Tensor]) -> tuple[Tensor, ...]:
    """The backward op's outputs for tracing: (du, ddelta, dA, dB, dC) shaped like their inputs,
    dD / ddelta_bias like D / delta_bias, or empty (shape (0,)) when those are None."""
    optional = tuple(torch.empty_like(t) if t is not None else A.new_empty(0) for t in (D, delta_bias))
    return tuple(torch.empty_like(t) for t in (u, delta, A, B, C)) + optional
