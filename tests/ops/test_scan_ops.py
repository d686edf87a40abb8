"""The 2D selective-scan op: every backend against an independent fp64 reference, gradients,
bad inputs, dtypes, torch.compile and the extension-loading fallbacks."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from vmamba2d.ops import backend_info, selective_scan_2d
from vmamba2d.ops.compiled import extensions
from support.scan_cases import BAD_INPUTS, TENSOR_ARGS, grads, make_inputs, reference_scan, valid_inputs

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("cpu", "torch", "reference")







# (height, width, batch, dim, groups, N, use_d, use_bias, softplus)
FORWARD_CASES = [
    (1, 1, 2, 4, 2, 4, True, True, True),
    (1, 17, 2, 4, 1, 16, True, False, True),
    (17, 1, 1, 6, 2, 4, False, True, False),
    (7, 7, 2, 8, 4, 4, True, True, True),
    (7, 7, 1, 4, 1, 16, False, False, True),
    (13, 29, 1, 6, 2, 1, True, True, False),
    (13, 29, 2, 8, 4, 16, True, True, True),
    (56, 56, 1, 2, 1, 4, True, True, True),
    (56, 56, 2, 4, 2, 1, False, True, True),
]


def _case_id(case):
    h, w, b, d, g, n, use_d, use_bias, sp = case
    return f"{h}x{w}-b{b}-d{d}-g{g}-N{n}" + "-D" * use_d + "-bias" * use_bias + "-softplus" * sp


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", FORWARD_CASES, ids=_case_id)
def test_forward_matches_reference(case, backend):
    height, width, batch, dim, groups, nstate, use_d, use_bias, softplus = case
    if backend == "reference" and height * width > 1000:
        pytest.skip("the reference backend's Python loop is too slow for 56x56 in the fast suite")
    inputs = make_inputs(batch, dim, groups, nstate, height, width, use_d=use_d,
                         use_bias=use_bias, softplus=softplus, seed=height * 100 + width)
    expected = reference_scan(**inputs, height=height, width=width)
    y = selective_scan_2d(**inputs, height=height, width=width, backend=backend)
    assert y.dtype == torch.float64 and y.shape == (batch, dim, height * width)
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_forward_fp32_matches_fp64_reference(backend):
    inputs = make_inputs(2, 8, 2, 16, 56, 56, seed=5)
    expected = reference_scan(**inputs, height=56, width=56)
    fp32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    y = selective_scan_2d(**fp32, height=56, width=56, backend=backend)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nstate", [1, 3])
def test_constant_decay_matches_manhattan_closed_form(backend, nstate):
    """With constant decay a, h[i, j] = sum_{i'<=i, j'<=j} a^((i-i') + (j-j')) x[i', j']."""
    height, width, step = 6, 9, 0.7
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(1, 1, height * width, generator=gen, dtype=torch.float64)
    B = torch.randn(1, 1, nstate, height * width, generator=gen, dtype=torch.float64)
    C = torch.randn(1, 1, nstate, height * width, generator=gen, dtype=torch.float64)
    rates = -torch.linspace(0.3, 1.5, nstate, dtype=torch.float64)[None, :]
    delta = torch.full_like(u, step)
    y = selective_scan_2d(u, delta, rates, B, C, None, None, False, height=height, width=width,
                          backend=backend)

    x = (step * u[0, 0] * B[0, 0]).reshape(nstate, height, width).numpy()
    expected = np.zeros((height, width))
    for n in range(nstate):
        a = np.exp(step * rates[0, n].item())
        c = C[0, 0, n].reshape(height, width).numpy()
        for i in range(height):
            for j in range(width):
                manhattan = np.add.outer(i - np.arange(i + 1), j - np.arange(j + 1))
                expected[i, j] += c[i, j] * np.sum(a ** manhattan * x[n, : i + 1, : j + 1])
    np.testing.assert_allclose(y[0, 0].reshape(height, width).numpy(), expected, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------
GRADCHECK_CASES = [
    # (height, width, batch, dim, groups, N, use_d, use_bias, softplus)
    (3, 4, 2, 4, 2, 2, True, True, True),
    (1, 5, 1, 4, 1, 3, False, False, False),
    (4, 1, 2, 2, 2, 2, True, False, True),
    (2, 3, 1, 6, 2, 1, False, True, False),
]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("case", GRADCHECK_CASES, ids=_case_id)
def test_gradcheck(case, backend):
    height, width, batch, dim, groups, nstate, use_d, use_bias, softplus = case
    inputs = make_inputs(batch, dim, groups, nstate, height, width, use_d=use_d,
                         use_bias=use_bias, softplus=softplus, seed=7)
    names = [k for k in TENSOR_ARGS if inputs[k] is not None]
    leaves = tuple(inputs[k].clone().requires_grad_() for k in names)

    def scan(*tensors):
        kwargs = dict(inputs, **dict(zip(names, tensors)))
        return selective_scan_2d(**kwargs, height=height, width=width, backend=backend)

    assert torch.autograd.gradcheck(scan, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


# Larger maps, several channels per group (dB / dC summed over channels, in channel chunks).
GRAD_CASES = [
    (13, 29, 1, 8, 2, 4, True, True, True),
    (7, 7, 2, 8, 4, 16, True, True, False),
    (32, 32, 1, 3, 1, 2, False, True, True),
    (1, 1, 3, 4, 1, 2, True, True, True),
]




@pytest.mark.parametrize("case", GRAD_CASES, ids=_case_id)
def test_cpu_gradients_match_reference(case):
    height, width, batch, dim, groups, nstate, use_d, use_bias, softplus = case
    inputs = make_inputs(batch, dim, groups, nstate, height, width, use_d=use_d,
                         use_bias=use_bias, softplus=softplus, seed=11)
    dy = torch.randn(batch, dim, height * width, generator=torch.Generator().manual_seed(12),
                     dtype=torch.float64)
    expected = grads(inputs, height, width, dy, reference_scan)
    got = grads(inputs, height, width, dy,
                 lambda **kw: selective_scan_2d(**kw, backend="cpu"))
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_instruction_set_build_matches_reference(isa, monkeypatch):
    monkeypatch.setenv("VMAMBA2D_CPU_ISA", isa)
    if extensions.cpu_extension().isa() != isa:
        pytest.skip(f"this CPU (or compiler) has no {isa} build of the kernel")
    height, width = 9, 13
    inputs = make_inputs(2, 6, 2, 5, height, width, seed=43)
    dy = torch.randn(2, 6, height * width, generator=torch.Generator().manual_seed(44), dtype=torch.float64)
    expected = grads(inputs, height, width, dy, reference_scan)
    kernel = lambda **kw: selective_scan_2d(**kw, backend="cpu")  # noqa: E731
    got64 = grads(inputs, height, width, dy, kernel)
    fp32 = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    got32 = grads(fp32, height, width, dy.float(), kernel)
    for name in expected:
        torch.testing.assert_close(got64[name], expected[name], rtol=1e-9, atol=1e-9, msg=name)
        torch.testing.assert_close(got32[name].double(), expected[name], rtol=1e-3, atol=1e-3, msg=name)
    y32 = selective_scan_2d(**fp32, height=height, width=width, backend="cpu")
    torch.testing.assert_close(y32.double(), reference_scan(**inputs, height=height, width=width),
                               rtol=1e-5, atol=1e-5)


def test_unknown_instruction_set_cap_is_rejected(monkeypatch):
    monkeypatch.setenv("VMAMBA2D_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="VMAMBA2D_CPU_ISA"):
        selective_scan_2d(**valid_inputs(), height=3, width=4, backend="cpu")


def test_cpu_backward_is_deterministic_across_runs_and_threads():
    inputs = make_inputs(1, 16, 2, 4, 9, 11, dtype=torch.float32, seed=13)
    dy = torch.randn(1, 16, 99, generator=torch.Generator().manual_seed(14))
    kernel = lambda **kw: selective_scan_2d(**kw, backend="cpu")  # noqa: E731
    threads = torch.get_num_threads()
    try:
        runs = [grads(inputs, 9, 11, dy, kernel) for _ in range(2)]
        torch.set_num_threads(1)
        runs.append(grads(inputs, 9, 11, dy, kernel))
    finally:
        torch.set_num_threads(threads)
    for name in runs[0]:
        assert all(torch.equal(runs[0][name], run[name]) for run in runs[1:]), name


def test_non_contiguous_inputs():
    batch, dim, groups, nstate, height, width = 2, 4, 2, 3, 5, 6
    length = height * width
    gen = torch.Generator().manual_seed(17)
    kwargs = dict(
        u=torch.randn(batch, length, dim, generator=gen, dtype=torch.float64).transpose(1, 2),
        delta=torch.randn(batch, dim, 2 * length, generator=gen, dtype=torch.float64)[..., ::2],
        A=-(0.2 + torch.rand(nstate, dim, generator=gen, dtype=torch.float64)).t(),
        B=torch.randn(batch, nstate, groups, length, generator=gen, dtype=torch.float64).transpose(1, 2),
        C=torch.randn(groups, batch, nstate, length, generator=gen, dtype=torch.float64).transpose(0, 1),
        D=torch.randn(2 * dim, generator=gen, dtype=torch.float64)[::2],
        delta_bias=torch.randn(dim, 2, generator=gen, dtype=torch.float64)[:, 1],
        delta_softplus=True,
    )
    assert not any(kwargs[k].is_contiguous() for k in TENSOR_ARGS)
    dy = torch.randn(batch, dim, length, generator=gen, dtype=torch.float64)
    expected = grads(kwargs, height, width, dy, reference_scan)
    got = grads(kwargs, height, width, dy, lambda **kw: selective_scan_2d(**kw, backend="cpu"))
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-9, atol=1e-9, msg=name)
    # The non-contiguous dy of a transposed output reaches the backward kernel too.
    y = selective_scan_2d(**kwargs, height=height, width=width, backend="cpu")
    torch.testing.assert_close(y, reference_scan(**kwargs, height=height, width=width))


def test_cpu_kernel_supports_max_nstate():
    from vmamba2d.ops.interface import MAX_NSTATE

    inputs = make_inputs(1, 2, 1, MAX_NSTATE["cpu"], 2, 3, seed=19)
    y = selective_scan_2d(**inputs, height=2, width=3, backend="cpu")
    torch.testing.assert_close(y, reference_scan(**inputs, height=2, width=3))


# --------------------------------------------------------------------------------------------
# Dtypes: autocast, half inputs, out_dtype
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_under_autocast_accumulate_in_fp32(half):
    height, width = 12, 10
    inputs = make_inputs(2, 4, 2, 8, height, width, dtype=torch.float32, seed=23)
    for name in ("u", "delta", "B", "C"):  # the activations are half; A, D, delta_bias stay fp32
        inputs[name] = inputs[name].to(half)
    exact = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    expected = reference_scan(**exact, height=height, width=width)
    leaves = {k: inputs[k].clone().requires_grad_() for k in TENSOR_ARGS}
    with torch.autocast("cpu", dtype=half):
        y_half = selective_scan_2d(**dict(inputs, **leaves), height=height, width=width, backend="cpu")
        y_fp32 = selective_scan_2d(**inputs, height=height, width=width, backend="cpu",
                                   out_dtype=torch.float32)
    assert y_half.dtype == half and y_fp32.dtype == torch.float32
    # fp32 accumulation: the fp32 output matches the exact result far below half precision.
    torch.testing.assert_close(y_fp32.double(), expected, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(y_half.double(), expected, rtol=1e-2, atol=2e-2)
    y_half.float().sum().backward()
    for name, leaf in leaves.items():
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype, name
        assert torch.isfinite(leaf.grad.float()).all(), name


def test_fp64_inputs_with_fp32_parameters_keep_gradient_dtypes():
    inputs = make_inputs(1, 4, 2, 3, 5, 5, seed=29)
    for name in ("A", "D", "delta_bias"):
        inputs[name] = inputs[name].float()
    leaves = {k: inputs[k].clone().requires_grad_() for k in TENSOR_ARGS}
    y = selective_scan_2d(**dict(inputs, **leaves), height=5, width=5, backend="cpu")
    assert y.dtype == torch.float64
    y.sum().backward()
    for name, leaf in leaves.items():
        assert leaf.grad.dtype == leaf.dtype, name
    exact = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    torch.testing.assert_close(y.detach(), reference_scan(**exact, height=5, width=5))






@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_naming_the_argument(bad, backend):
    _, changes, height, width, error, fragment = bad
    inputs = dict(valid_inputs(), **changes)
    with pytest.raises(error, match=fragment):
        selective_scan_2d(**inputs, height=height, width=width, backend=backend)


def test_too_many_states_for_the_cpu_kernel():
    inputs = make_inputs(1, 2, 1, 257, 2, 2, dtype=torch.float32)
    with pytest.raises(ValueError, match="N=257"):
        selective_scan_2d(**inputs, height=2, width=2, backend="cpu")
    # The pure-PyTorch backend has no such limit.
    assert selective_scan_2d(**inputs, height=2, width=2, backend="torch").shape == (1, 2, 4)


@pytest.mark.parametrize("backend, error", [("fast", ValueError), ("cuda", ValueError)])
def test_bad_backend(backend, error):
    with pytest.raises(error, match="backend"):
        selective_scan_2d(**valid_inputs(), height=3, width=4, backend=backend)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("out_dtype", [torch.int64, torch.bool, "float32", float], ids=["int64", "bool", "str", "type"])
def test_out_dtype_must_be_a_floating_torch_dtype(out_dtype, backend):
    """Before: int64 truncated y silently, 'float32' failed with torch's 'Invalid device string'."""
    from vmamba2d.ops import cross_selective_scan_2d

    with pytest.raises(TypeError, match=r"out_dtype must be None or a floating torch.dtype"):
        selective_scan_2d(**valid_inputs(), height=3, width=4, backend=backend, out_dtype=out_dtype)
    u = torch.randn(1, 2, 3, 4)
    cross = dict(u=u, delta=torch.randn(1, 4, 2, 3, 4), A=-torch.ones(8, 1), B=torch.randn(1, 4, 1, 3, 4),
                 C=torch.randn(1, 4, 1, 3, 4))
    with pytest.raises(TypeError, match=r"out_dtype must be None or a floating torch.dtype"):
        cross_selective_scan_2d(**cross, backend=backend, out_dtype=out_dtype)


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.bfloat16])
def test_out_dtype_floating_is_the_output_dtype(out_dtype):
    inputs = valid_inputs()
    y = selective_scan_2d(**inputs, height=3, width=4, backend="cpu", out_dtype=out_dtype)
    in_fp64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    expected = reference_scan(**in_fp64, height=3, width=4)
    assert y.dtype == out_dtype
    torch.testing.assert_close(y, expected.to(out_dtype), rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------
# torch.compile and the extension-loading paths
# --------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph_traces_the_custom_op():
    import torch._dynamo

    inputs = make_inputs(2, 4, 2, 3, 5, 6, dtype=torch.float32, seed=37)
    names = [k for k in TENSOR_ARGS]

    def layer(u, delta, A, B, C, D, delta_bias):
        y = selective_scan_2d(u, delta, A, B, C, D, delta_bias, True, height=5, width=6, backend="cpu")
        return torch.tanh(y) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    eager_leaves = [inputs[k].clone().requires_grad_() for k in names]
    compiled_leaves = [inputs[k].clone().requires_grad_() for k in names]
    expected = layer(*eager_leaves)
    got = compiled(*compiled_leaves)
    torch.testing.assert_close(got, expected)
    expected.sum().backward()
    got.sum().backward()
    for name, a, b in zip(names, eager_leaves, compiled_leaves):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_custom_op_fake_implementations_pass_opcheck():
    from vmamba2d.ops.compiled import ops as compiled_ops

    inputs = make_inputs(1, 4, 2, 2, 3, 4, dtype=torch.float32, seed=41)
    args = [inputs[k] for k in TENSOR_ARGS]
    torch.library.opcheck(compiled_ops.selective_scan_2d_fwd, (*args, True, 3, 4, False),
                          test_utils=("test_schema", "test_faketensor"))
    dy = torch.randn(1, 4, 12)
    torch.library.opcheck(compiled_ops.selective_scan_2d_bwd, (*args, True, 3, 4, dy),
                          test_utils=("test_schema", "test_faketensor"))


def _run_without_built_extension(code: str, **env_overrides: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``vmamba2d._C_cpu`` cannot be imported (a None
    entry in sys.modules makes its import fail), like a source checkout without a built kernel."""
    code = 'import sys; sys.modules["vmamba2d._C_cpu"] = None\n' + textwrap.dedent(code)
    env = dict(os.environ, **env_overrides)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    env.pop("VMAMBA2D_SCAN_BACKEND", None)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_without_any_kernel_auto_warns_once_and_cpu_raises():
    result = _run_without_built_extension("""
        import warnings
        import torch
        from vmamba2d.ops import backend_info, selective_scan_2d

        u = torch.randn(1, 2, 6); B = torch.randn(1, 1, 2, 6); A = -torch.ones(2, 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = selective_scan_2d(u, u, A, B, B, height=2, width=3)
            selective_scan_2d(u, u, A, B, B, height=2, width=3)
        fallback = [w for w in caught if "pure-PyTorch" in str(w.message)]
        assert len(fallback) == 1 and fallback[0].category is RuntimeWarning, caught
        torch.testing.assert_close(y, selective_scan_2d(u, u, A, B, B, height=2, width=3, backend="torch"))
        info = backend_info()
        assert info["cpu_extension"] is False and info["auto_cpu"] == "torch", info
        try:
            selective_scan_2d(u, u, A, B, B, height=2, width=3, backend="cpu")
        except RuntimeError as err:
            assert "VMAMBA2D_DISABLE_JIT" in str(err), err
        else:
            raise AssertionError("backend='cpu' without a kernel must raise")
        print("ok")
    """, VMAMBA2D_DISABLE_JIT="1")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


@pytest.mark.slow
def test_jit_build_of_the_cpu_kernel():
    result = _run_without_built_extension("""
        import torch
        from vmamba2d.ops import backend_info, selective_scan_2d

        from vmamba2d.ops.compiled import extensions

        info = backend_info()
        assert info["cpu_extension_source"] == "jit" and info["auto_cpu"] == "cpu", info
        assert extensions.cpu_extension().openmp(), "the JIT build must parallelise with OpenMP"
        u = torch.randn(1, 2, 12, dtype=torch.float64); B = torch.randn(1, 1, 3, 12, dtype=torch.float64)
        A = -torch.rand(2, 3, dtype=torch.float64) - 0.1
        torch.testing.assert_close(
            selective_scan_2d(u, u, A, B, B, height=3, width=4, backend="cpu"),
            selective_scan_2d(u, u, A, B, B, height=3, width=4, backend="reference"),
        )
        print("ok")
    """, VMAMBA2D_DISABLE_JIT="0")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


def test_backend_info_reports_the_cpu_kernel():
    info = backend_info()
    assert info["cpu_extension"] is True
    # Without OpenMP in the extension's own build, at::parallel_for silently runs on one thread.
    assert extensions.cpu_extension().openmp()
    assert info["cpu_extension_source"] in ("built", "jit")


@pytest.mark.parametrize("value, pinned", [("", None), ("auto", None), (" torch ", "torch"), ("cpu", "cpu")])
def test_backend_info_reports_the_backend_the_environment_pins(monkeypatch, value, pinned):
    """backend_info() reads VMAMBA2D_SCAN_BACKEND as the resolver does: 'auto' and empty pin nothing."""
    monkeypatch.setenv("VMAMBA2D_SCAN_BACKEND", value)
    info = backend_info()
    assert info["env_override"] == pinned
    assert info["auto_cpu"] == (pinned or "cpu")
    x = valid_inputs()
    ran = selective_scan_2d(**x, height=3, width=4)
    assert torch.allclose(ran, selective_scan_2d(**x, height=3, width=4, backend=info["auto_cpu"]), atol=0, rtol=0)


def test_an_unknown_pinned_backend_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("VMAMBA2D_SCAN_BACKEND", "fast")
    with pytest.raises(ValueError, match="VMAMBA2D_SCAN_BACKEND must be one of"):
        backend_info()
    with pytest.raises(ValueError, match="VMAMBA2D_SCAN_BACKEND must be one of"):
        selective_scan_2d(**valid_inputs(), height=3, width=4)
