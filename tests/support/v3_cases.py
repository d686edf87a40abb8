"""The v3 CUDA kernels' test inputs, fp64 reference and the emulated / GPU entry points the v3 tests share."""
from __future__ import annotations
import pytest
import torch
from support.cuda_emulation_build import v3_emulation
from vmamba2d.ops import selective_scan_2d
from vmamba2d.ops.compiled import extensions


HAS_GPU = torch.cuda.is_available()


class _LazyEmulation:
    """The v3 kernels' host emulation module (``_emulate_*``, ``_launch_plan``, ``_softplus`` ...),
    built by the C++ compiler on first attribute access and reused while its sources are unchanged."""

    def __getattr__(self, name):
        return getattr(v3_emulation(), name)


EMULATION = _LazyEmulation()


needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")


def gpu_kernels():
    """The module that runs the CUDA kernels on this GPU (NVRTC, or the nvcc build where one exists)."""
    module = extensions.cuda_extension()
    assert module is not None, extensions.failure_reason("cuda")
    return module


def make_inputs(batch, dim, groups, nstate, height, width, *, dtype=torch.float32, device="cpu",
                use_d=True, use_bias=True, softplus=True, seed=0):
    """Random scan inputs (never zeros): A negative; delta around the softplus knee, or already a
    positive step size when ``softplus`` is False (a negative dt would make Abar > 1 and overflow
    fp32 on large maps)."""
    g = torch.Generator().manual_seed(seed)
    length = height * width
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    inputs = {
        "u": rand(batch, dim, length),
        "delta": (rand(batch, dim, length) * 0.5 - 1.0 if softplus
                  else rand(batch, dim, length).abs() * 0.2 + 0.02),
        "A": -(torch.rand(dim, nstate, generator=g) * 1.5 + 0.05),
        "B": rand(batch, groups, nstate, length),
        "C": rand(batch, groups, nstate, length),
        "D": rand(dim) if use_d else None,
        "delta_bias": rand(dim) * 0.3 if use_bias else None,
    }
    out = {}
    for name, t in inputs.items():
        if t is None:
            out[name] = None
            continue
        keep_fp32 = name in ("A", "D", "delta_bias")
        out[name] = t.to(device=device, dtype=torch.float32 if keep_fp32 else dtype)
    return out


ORDER = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def reference(inputs, dy, height, width, softplus=True):
    """fp64 CPU forward and gradients of every input via the pure-PyTorch backend's autograd."""
    leaves = {
        k: None if v is None else v.detach().cpu().double().requires_grad_() for k, v in inputs.items()
    }
    y = selective_scan_2d(
        *(leaves[k] for k in ORDER), delta_softplus=softplus, height=height, width=width,
        backend="torch",
    )
    y.backward(dy.detach().cpu().double())
    grads = []
    for k in ORDER:
        t = leaves[k]
        if t is None:
            grads.append(None)
        else:
            grads.append(t.grad if t.grad is not None else torch.zeros_like(t))
    return y.detach(), grads


def assert_close(name, got, ref, rtol):
    """Max-abs error relative to the reference's largest magnitude (robust for near-zero entries)."""
    got = got.detach().cpu().double()
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    scale = ref.abs().max().item() + 1e-12
    err = (got - ref).abs().max().item() / scale
    assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.1e}"


def check_all(kernel_fwd, kernel_bwd, inputs, height, width, *, rtol, softplus=True, dy_fp32=False,
              out_fp32=False, seed=1, **options):
    """Forward (saving carries) and backward (from them) against the fp64 reference.

    ``options`` go to both calls (the emulation's order / sm_count)."""
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = kernel_fwd(*args, softplus, height, width, out_fp32, True, **options)
    expected_dtype = torch.float32 if out_fp32 else inputs["u"].dtype
    assert y.dtype == expected_dtype
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(y.shape, generator=gen).to(
        device=y.device, dtype=torch.float32 if dy_fp32 else inputs["u"].dtype)
    grads = kernel_bwd(*args, softplus, height, width, dy, carry_h, carry_v, **options)
    y_ref, grads_ref = reference(inputs, dy, height, width, softplus)
    assert_close("y", y, y_ref, rtol)
    for name, got, ref, given in zip(ORDER, grads, grads_ref, args):
        if given is None:
            assert got is None, f"d{name} must be None when {name} is None"
            continue
        expected = torch.float32 if name in ("A", "D", "delta_bias") else inputs["u"].dtype
        assert got.dtype == expected, f"d{name}: dtype {got.dtype}, expected {expected}"
        assert_close("d" + name, got, ref, rtol)
    return y, grads


def emulated_fwd(*args, **options):
    return EMULATION._emulate_forward(*args, **options)


def emulated_bwd(*args, **options):
    return EMULATION._emulate_backward(*args, **options)


# Vectorised global accesses: a quad (4 consecutive cells of a tile row) moves as one 16-byte
# (fp32) / 8-byte (fp16, bf16) access when its cells are consecutive in memory and aligned; the
# emulation checks alignment and bounds of every vector access and counts them.
QUADS_PER_TILE = 32 * 32 // 4


def offset_by_one(t):
    """The same values at an odd element offset in their storage (contiguous, misaligned rows)."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype)
    flat[1:] = t.reshape(-1)
    return flat[1:].view(t.shape)


def emulated_vector_accesses(inputs, height, width, rtol=5e-5, **options):
    """Vector accesses of the emulated forward and of the backward (``check_all`` compares both
    with the fp64 reference)."""
    counts = []

    def counting(run):
        def wrapped(*args, **kw):
            out = run(*args, **kw)
            counts.append(EMULATION._emulation_vector_accesses())
            return out
        return wrapped

    check_all(counting(emulated_fwd), counting(emulated_bwd), inputs, height, width, rtol=rtol,
              **options)
    return counts
