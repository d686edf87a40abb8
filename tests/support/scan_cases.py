"""The single-route op's test inputs, a float64 loop reference, gradients and bad-input cases the op tests share."""
from __future__ import annotations
import numpy as np
import torch


# --------------------------------------------------------------------------------------------
# Independent reference: the recurrence of docs/scan.md, written out pixel by pixel.
# --------------------------------------------------------------------------------------------
def reference_scan(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width):
    """y (batch, dim, L) from explicit loops over rows and columns (vectorised over b, d, n)."""
    batch, dim, length = u.shape
    groups, nstate = B.shape[1], A.shape[1]
    group_of = torch.arange(dim) // (dim // groups)
    z = delta if delta_bias is None else delta + delta_bias[None, :, None]
    dt = torch.log1p(torch.exp(z)) if delta_softplus else z
    decay = torch.exp(dt[:, :, None, :] * A[None, :, :, None]).reshape(batch, dim, nstate, height, width)
    x = ((dt * u)[:, :, None, :] * B[:, group_of]).reshape(batch, dim, nstate, height, width)
    zero = torch.zeros(batch, dim, nstate, dtype=u.dtype)
    above = [zero] * width
    rows = []
    for i in range(height):
        left = zero
        row = []
        for j in range(width):
            left = decay[..., i, j] * left + x[..., i, j]  # horizontal
            row.append(decay[..., i, j] * above[j] + left)  # vertical
        rows.append(torch.stack(row, dim=-1))
        above = row
    h = torch.stack(rows, dim=-2).reshape(batch, dim, nstate, length)
    y = (C[:, group_of] * h).sum(dim=2)
    if D is not None:
        y = y + D[None, :, None] * u
    return y


def make_inputs(batch, dim, groups, nstate, height, width, *, use_d=True, use_bias=True,
                softplus=True, dtype=torch.float64, seed=0):
    """Random, well-conditioned scan inputs as a dict of selective_scan_2d keyword arguments."""
    gen = torch.Generator().manual_seed(seed)
    length = height * width

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    # Without softplus dt = delta (+ bias) must stay positive so the decay stays below 1.
    delta = randn(batch, dim, length) if softplus else 0.1 + 0.9 * rand(batch, dim, length)
    bias = (0.5 * randn(dim) if softplus else 0.1 * rand(dim)) if use_bias else None
    inputs = dict(
        u=randn(batch, dim, length),
        delta=delta,
        A=-(0.2 + rand(dim, nstate)),
        B=randn(batch, groups, nstate, length),
        C=randn(batch, groups, nstate, length),
        D=randn(dim) if use_d else None,
        delta_bias=bias,
        delta_softplus=softplus,
    )
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


TENSOR_ARGS = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def grads(inputs, height, width, dy, fn):
    names = [k for k in TENSOR_ARGS if inputs[k] is not None]
    leaves = {k: inputs[k].clone().requires_grad_() for k in names}
    y = fn(**dict(inputs, **leaves), height=height, width=width)
    grads = torch.autograd.grad(y, list(leaves.values()), dy, allow_unused=True)
    return {k: (torch.zeros_like(leaves[k]) if g is None else g) for k, g in zip(names, grads)}


def assert_half_precision_close(y, y_ref, got, expected, inputs):
    """y and the gradients ``got`` of a run on half-precision ``inputs`` against the fp64 reference on
    the same rounded inputs (y_ref, ``expected``): y within rtol 1e-2 / atol 2e-2; each gradient in
    its input's dtype (rounded once, at the end) and within 1e-2 of the reference's largest value."""
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-2, atol=2e-2)
    for name in expected:
        assert got[name].dtype == inputs[name].dtype, name
        scale = expected[name].abs().max().item()
        torch.testing.assert_close(got[name].double(), expected[name], rtol=1e-2, atol=1e-2 * scale, msg=name)


# --------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------
def valid_inputs():
    return make_inputs(2, 4, 2, 3, 3, 4, dtype=torch.float32, seed=31)


BAD_INPUTS = [
    # (id, changes to the valid inputs, height, width, error type, message fragment)
    ("L-not-HxW", {}, 3, 5, ValueError, "L must equal height"),
    ("height-not-int", {}, 3.0, 4, ValueError, "height"),
    ("dim-not-divisible", {"B": torch.zeros(2, 3, 3, 12), "C": torch.zeros(2, 3, 3, 12)}, 3, 4,
     ValueError, "divisible"),
    ("delta-shape", {"delta": torch.zeros(2, 4, 11)}, 3, 4, ValueError, "delta"),
    ("A-shape", {"A": -torch.ones(5, 3)}, 3, 4, ValueError, "A must have shape"),
    ("B-shape", {"B": torch.zeros(2, 2, 2, 12)}, 3, 4, ValueError, "B must have shape"),
    ("C-shape", {"C": torch.zeros(2, 2, 3, 13)}, 3, 4, ValueError, "C must have shape"),
    ("D-shape", {"D": torch.ones(3)}, 3, 4, ValueError, "D must have shape"),
    ("bias-shape", {"delta_bias": torch.ones(4, 1)}, 3, 4, ValueError, "delta_bias must have shape"),
    ("device-differs", {"B": torch.zeros(2, 2, 3, 12, device="meta")}, 3, 4, ValueError, "B is on meta"),
    ("integer-u", {"u": torch.zeros(2, 4, 12, dtype=torch.int64)}, 3, 4, TypeError, "u must be a floating"),
    ("integer-A", {"A": torch.zeros(4, 3, dtype=torch.int32)}, 3, 4, TypeError, "A must be a floating"),
    ("u-not-tensor", {"u": np.zeros((2, 4, 12))}, 3, 4, TypeError, "u must be a torch.Tensor"),
]
