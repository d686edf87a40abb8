"""The scan op on degenerate shapes: empty batches / channels and 1 x 1 maps, on every backend.

Empty inputs must give empty outputs and correctly shaped (zero) gradients instead of crashing the
process; every parameter that takes part in the scan gets a gradient tensor (zeros where the
derivative is zero), never None, because DistributedDataParallel treats None as "unused".
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from vmamba2d.ops import backend_info, selective_scan_2d

REPO_ROOT = Path(__file__).resolve().parents[2]
TENSOR_ARGS = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def _backends() -> list:
    backends = ["torch", "reference"]
    if backend_info()["cpu_extension"]:
        backends.append("cpu")
    return backends


def _scan_inputs(batch: int, dim: int, groups: int, nstate: int, length: int, seed: int = 0) -> dict:
    """Leaf fp64 tensors (requires_grad) for selective_scan_2d, as a dict of keyword arguments."""
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).requires_grad_()

    return dict(
        u=leaf(batch, dim, length),
        delta=leaf(batch, dim, length),
        A=(-(0.2 + torch.rand(dim, nstate, generator=gen, dtype=torch.float64))).requires_grad_(),
        B=leaf(batch, groups, nstate, length),
        C=leaf(batch, groups, nstate, length),
        D=leaf(dim),
        delta_bias=leaf(dim, scale=0.5),
    )


_EMPTY_SHAPES_SCRIPT = """
import torch
from vmamba2d.ops import selective_scan_2d

# (batch, dim, groups, nstate, height, width)
SHAPES = [(0, 4, 2, 3, 3, 5), (2, 0, 1, 3, 3, 5), (0, 0, 1, 2, 1, 1), (0, 6, 3, 2, 1, 7)]
for batch, dim, groups, nstate, height, width in SHAPES:
    print("case", (batch, dim, groups, nstate, height, width), flush=True)
    length = height * width
    grads = {}
    for backend in ("torch", "cpu"):
        g = torch.Generator().manual_seed(0)
        leaf = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_()
        args = [leaf(batch, dim, length), leaf(batch, dim, length), leaf(dim, nstate),
                leaf(batch, groups, nstate, length), leaf(batch, groups, nstate, length), leaf(dim), leaf(dim)]
        y = selective_scan_2d(*args, True, height=height, width=width, backend=backend)
        assert y.shape == (batch, dim, length), (backend, y.shape)
        got = torch.autograd.grad(y.sum(), args)  # no allow_unused: None would raise
        grads[backend] = got
    for expected, got in zip(grads["torch"], grads["cpu"]):
        assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape)
        assert torch.count_nonzero(got) == 0 and torch.count_nonzero(expected) == 0
print("ok", flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not backend_info()["cpu_extension"], reason="the compiled CPU kernel is unavailable")
def test_cpu_kernel_backward_on_empty_batch_or_channels_returns_empty_gradients():
    """Run in a child process: a kernel crash (SIGFPE from a division by batch * groups) must fail
    this test, not kill pytest."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.pop("VMAMBA2D_SCAN_BACKEND", None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EMPTY_SHAPES_SCRIPT)],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    last_case = [line for line in result.stdout.splitlines() if line.startswith("case")][-1:]
    assert result.returncode == 0, (
        f"child exited with {result.returncode} (negative: killed by that signal) during {last_case}; "
        f"stderr:\n{result.stderr[-2000:]}"
    )
    assert result.stdout.rstrip().endswith("ok"), result.stdout


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("batch, dim", [(0, 4), (2, 0)])
def test_empty_batch_or_channels_in_process(backend, batch, dim):
    """The Python backends (the CPU kernel runs in a child process above): empty output, gradients
    of the inputs' shapes, all zero."""
    inputs = _scan_inputs(batch, dim, groups=min(dim, 2) or 1, nstate=2, length=6)
    y = selective_scan_2d(**inputs, delta_softplus=True, height=2, width=3, backend=backend)
    assert y.shape == (batch, dim, 6)
    grads = torch.autograd.grad(y.sum(), [inputs[k] for k in TENSOR_ARGS])
    for name, grad in zip(TENSOR_ARGS, grads):
        assert grad.shape == inputs[name].shape, name
        assert torch.count_nonzero(grad) == 0, name


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("height, width", [(1, 1), (1, 2), (2, 1)])
def test_every_input_gets_a_gradient_tensor_on_tiny_maps(backend, height, width):
    """On a 1 x 1 map the state starts from zero, so y does not depend on A: dA must be a zero
    tensor (not None); on 1 x 2 / 2 x 1 maps dA is non-zero. All gradients match an explicit
    recurrence differentiated by autograd."""
    inputs = _scan_inputs(batch=2, dim=4, groups=2, nstate=3, length=height * width, seed=1)
    y = selective_scan_2d(**inputs, delta_softplus=True, height=height, width=width, backend=backend)
    weights = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=y.dtype)
    grads = torch.autograd.grad((y * weights).sum(), [inputs[k] for k in TENSOR_ARGS])  # None would raise

    expected = _explicit_grads(inputs, weights, height, width)
    for name, got in zip(TENSOR_ARGS, grads):
        torch.testing.assert_close(got, expected[name], rtol=1e-9, atol=1e-12, msg=name)
    dA = grads[TENSOR_ARGS.index("A")]
    if height * width == 1:
        assert torch.count_nonzero(dA) == 0
    else:
        assert dA.abs().min() > 0


def _explicit_grads(inputs: dict, weights: torch.Tensor, height: int, width: int) -> dict:
    """Gradients of sum(weights * y) for maps of at most two pixels, y written out by hand:
    pixel 0 has h = x0; pixel 1 (right of or below pixel 0) has h = a1 * x0 + x1."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    u, delta, A, B, C, D, bias = (leaves[k] for k in TENSOR_ARGS)
    groups = B.shape[1]
    per_group = u.shape[1] // groups
    Bc = B.repeat_interleave(per_group, dim=1)  # (batch, dim, N, L)
    Cc = C.repeat_interleave(per_group, dim=1)
    dt = torch.nn.functional.softplus(delta + bias[None, :, None])  # (batch, dim, L)
    x = dt[:, :, None, :] * Bc * u[:, :, None, :]  # (batch, dim, N, L)
    states = [x[..., 0]]
    if height * width == 2:
        decay = torch.exp(dt[:, :, None, 1] * A[None])
        states.append(decay * states[0] + x[..., 1])
    h = torch.stack(states, dim=-1)
    y = (Cc * h).sum(2) + D[None, :, None] * u
    grads = torch.autograd.grad((y * weights).sum(), [leaves[k] for k in TENSOR_ARGS], allow_unused=True)
    return {k: (torch.zeros_like(leaves[k]) if g is None else g) for k, g in zip(TENSOR_ARGS, grads)}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_one_pixel_and_empty_batch_gradients():
    if not backend_info()["cuda_extension"]:
        pytest.skip("the CUDA extension is not built")
    for batch, height, width in ((2, 1, 1), (0, 2, 3)):
        inputs = {
            k: v.detach().float().cuda().requires_grad_()
            for k, v in _scan_inputs(batch, 4, 2, 2, height * width).items()
        }
        y = selective_scan_2d(**inputs, delta_softplus=True, height=height, width=width, backend="cuda")
        grads = torch.autograd.grad(y.sum(), [inputs[k] for k in TENSOR_ARGS])
        assert grads[TENSOR_ARGS.index("A")].abs().max() == 0
        assert all(g.shape == inputs[k].shape for k, g in zip(TENSOR_ARGS, grads))
