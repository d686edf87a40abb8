"""vmamba2d.count_flops: the scan is counted once per route (1D or 2D), and the published numbers.

The published FLOPs at 224x224 (docs/models.md): 2DVMamba-T 4.94G, 2DVMamba-S 8.8G,
VMamba-T 4.91G, VMamba-S 8.7G; we require agreement within 3%.
"""
from __future__ import annotations

import pytest
import timm
import torch

import vmamba2d
from vmamba2d.models import SS2D

NARROW = dict(dims=16, depths=(1, 1, 1, 1))


def _scan_modules(model):
    return [m for m in model.modules() if isinstance(m, SS2D)]


def test_2d_scans_add_six_flops_per_state_and_position():
    """2D minus 1D = 6 * L * Di * N per route, summed over every SS2D (4 routes each)."""
    torch.manual_seed(0)
    ours = timm.create_model("vmamba2d_tiny", d_state=2, **NARROW)
    baseline = timm.create_model("vmamba_tiny", d_state=2, **NARROW)
    height, width = 64, 96
    expected = 0
    for stage, module in enumerate(_scan_modules(ours)):
        length = (height // (4 * 2**stage)) * (width // (4 * 2**stage))
        expected += 4 * 6 * length * module.d_inner * module.d_state
    difference = vmamba2d.count_flops(ours, (3, height, width)) - vmamba2d.count_flops(baseline, (3, height, width))
    assert difference == expected


def test_scan_flops_scale_with_state_size():
    """Only the scans depend on N: 1D scans add 9 * L * Di per extra state and route."""
    torch.manual_seed(0)
    one, two = (timm.create_model("vmamba_tiny", d_state=n, **NARROW) for n in (1, 2))
    height = width = 64
    # x_proj also grows by 2 outputs per extra state: 2 * L * Di multiply-adds per route.
    per_extra_state = 0
    for stage, module in enumerate(_scan_modules(one)):
        length = (height // (4 * 2**stage)) ** 2
        per_extra_state += 4 * (9 + 2) * length * module.d_inner
    assert vmamba2d.count_flops(two, (3, height, width)) - vmamba2d.count_flops(one, (3, height, width)) == per_extra_state


def test_count_flops_restores_backend_and_mode():
    model = timm.create_model("vmamba2d_tiny", scan_backend="torch", **NARROW).train()
    assert vmamba2d.count_flops(model, (3, 32, 64)) > 0
    assert model.training
    assert {m.scan_backend for m in _scan_modules(model)} == {"torch"}


def test_count_flops_refuses_without_compiled_kernel(monkeypatch):
    model = timm.create_model("vmamba2d_tiny", **NARROW)

    def unavailable(backend, device):
        raise RuntimeError("backend='cpu' requested but its kernel is unavailable")

    monkeypatch.setattr("vmamba2d.flops.resolve_backend", unavailable)
    with pytest.raises(RuntimeError, match="compiled cpu scan kernel"):
        vmamba2d.count_flops(model, (3, 32, 32))


@pytest.mark.parametrize("input_size", [(3, 224), (3, 224, 0), [3, 224.0, 224]])
def test_count_flops_bad_input_size(input_size):
    model = timm.create_model("vmamba2d_tiny", **NARROW)
    with pytest.raises(ValueError, match="input_size"):
        vmamba2d.count_flops(model, input_size)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, published_gflops",
    [("vmamba2d_tiny", 4.94), ("vmamba_tiny", 4.91), ("vmamba2d_small", 8.8), ("vmamba_small", 8.7)],
)
def test_flops_at_224_match_published(name, published_gflops):
    model = timm.create_model(name)
    gflops = vmamba2d.count_flops(model, (3, 224, 224)) / 1e9
    assert abs(gflops - published_gflops) / published_gflops < 0.03, gflops


@pytest.mark.slow
def test_count_flops_shows_users_no_fvcore_import_warning():
    """fvcore.nn calls torch.jit.script at import, which torch deprecates with a FutureWarning
    that users cannot act on; a fresh process that makes FutureWarnings errors still counts."""
    import subprocess
    import sys

    code = ("import timm, vmamba2d; "
            "print(vmamba2d.count_flops(timm.create_model('vmamba2d_tiny', dims=8, depths=(1, 1, 1, 1)), (3, 32, 32)))")
    result = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.strip().splitlines()[-1]) > 0
