"""Mixed precision: the norms keep the autocast dtype, bf16 logits and a bf16 training run match
fp32, fp16 autocast with a GradScaler stays finite on large activations.

The CPU runs use CPU autocast (the GPU is not in CI); CUDA autocast's policy, which runs
layer_norm in fp32, is checked on fake CUDA tensors (vmamba2d.analysis.traffic.cuda_autocast).
"""
from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d as TimmLayerNorm2d
from torch._subclasses.fake_tensor import FakeTensorMode

import vmamba2d  # noqa: F401  (registers the models)
from support.tiny_imagefolder import make_tiny_imagefolder
from vmamba2d.analysis.traffic import cuda_autocast
from vmamba2d.models.norm import LayerNorm2d


def _norm_pair(channels: int = 24) -> tuple[LayerNorm2d, TimmLayerNorm2d]:
    ours, theirs = LayerNorm2d(channels, eps=1e-5), TimmLayerNorm2d(channels, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(channels, generator=torch.Generator().manual_seed(2)))
        ours.bias.copy_(torch.randn(channels, generator=torch.Generator().manual_seed(3)))
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _maps(dtype: torch.dtype = torch.float32, channels: int = 24) -> torch.Tensor:
    x = 3 * torch.randn(2, channels, 5, 7, generator=torch.Generator().manual_seed(4)) + 1
    return x.to(dtype).contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------- LayerNorm2d


@pytest.mark.parametrize("channels_last", [True, False])
def test_layer_norm_equals_timms_outside_autocast(channels_last):
    ours, theirs = _norm_pair()
    x = _maps() if channels_last else _maps().contiguous()
    assert torch.equal(ours(x), theirs(x))
    assert list(ours.state_dict()) == ["weight", "bias"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_returns_the_maps_dtype_under_autocast(dtype):
    ours, _ = _norm_pair()
    x = _maps(dtype)
    with torch.autocast("cpu", dtype=dtype):
        y = ours(x)
        assert torch.is_autocast_enabled("cpu")  # the norm turned it off only for itself
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
    # against fp64 statistics of the same (rounded) input, with the weight rounded as the norm uses it
    w, b = ours.weight.detach().to(dtype).double(), ours.bias.detach().to(dtype).double()
    reference = F.layer_norm(x.double().permute(0, 2, 3, 1), [24], w, b, 1e-5).permute(0, 3, 1, 2)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(y.double(), reference, rtol=eps, atol=4 * eps)
    with torch.autocast("cpu", dtype=dtype):
        assert ours(_maps()).dtype == torch.float32  # an fp32 map stays fp32


def test_layer_norm_keeps_bf16_under_cudas_autocast_policy():
    """CUDA autocast runs layer_norm in fp32: timm's LayerNorm2d returns fp32 for a bf16 map there
    (the cast the residual stream paid), ours the map's bf16."""
    ours, theirs = _norm_pair()
    with FakeTensorMode() as mode:
        x = mode.from_tensor(_maps(torch.bfloat16)).to("cuda")
        for module in (ours, theirs):
            for name, p in list(module._parameters.items()):
                module._parameters[name] = torch.nn.Parameter(mode.from_tensor(p).to("cuda"))
        with cuda_autocast(torch.bfloat16):
            assert theirs(x).dtype == torch.float32
            assert ours(x).dtype == torch.bfloat16


# ---------------------------------------------------------------- the models in bf16 / fp16


def _model(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **kwargs)


def _images(batch: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vmamba2d_tiny", "vmamba_tiny"])
def test_bf16_autocast_logits_match_fp32(name):
    """Seeded random weights, 32 x 32 images: within timm's tolerance for its own models' outputs
    from a re-processed image (rtol = atol = 0.1, test_model_inference) and, tighter, 2% relative
    error (measured 1.2% at 64 x 64; ConvNeXt-T 0.6%). Random weights give near-tied top classes,
    so the top-1 is not compared."""
    model, x = _model(name).eval(), _images()
    with torch.no_grad():
        reference = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), reference, rtol=0.1, atol=0.1)
    assert ((logits.float() - reference).norm() / reference.norm()).item() < 0.02


@pytest.mark.slow
def test_fp16_autocast_with_grad_scaler_stays_finite_on_large_activations():
    """Images scaled x100 (activations far from unit scale) under fp16 autocast: every module's
    output finite, and a GradScaler trains (steps taken, parameters finite)."""
    model = _model("vmamba2d_tiny", num_classes=3).train()
    x, target = 100 * _images(), torch.tensor([0, 2])
    bad: list[str] = []

    def check(module, _args, output):
        if isinstance(output, torch.Tensor) and not torch.isfinite(output).all():
            bad.append(type(module).__name__)

    handles = [m.register_forward_hook(check) for m in model.modules()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    steps = 0
    for _ in range(3):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), target)
        assert torch.isfinite(loss), f"loss {loss}"
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        steps += scaler.get_scale() >= scale  # the scale drops only when a step is skipped
    for handle in handles:
        handle.remove()
    assert not bad, f"non-finite outputs of {sorted(set(bad))}"
    assert steps >= 1 and all(torch.isfinite(p).all() for p in model.parameters())


def _train_losses(dtype, data_root, steps: int = 6) -> list[float]:
    import torchvision
    from torchvision import transforms

    torch.manual_seed(0)
    # vmamba2d_tiny's blocks at a quarter of its width and depth: the same layers, a minute less in CI
    model = timm.create_model("vmamba2d_tiny", num_classes=3, dims=24, depths=(1, 1, 2, 1)).train()
    folder = torchvision.datasets.ImageFolder(
        data_root / "train", transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor(),
                                                 transforms.Normalize((0.5,) * 3, (0.25,) * 3)]))
    images = torch.stack([folder[i][0] for i in range(len(folder))])
    labels = torch.tensor(folder.targets)
    order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    losses = []
    for step in range(steps):
        batch = order[(8 * step) % len(order):][:8]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_bf16_training_losses_follow_fp32(tmp_path):
    """Six AdamW steps (lr 1e-4) of a narrow vmamba2d_tiny on the tiny ImageFolder (32 x 32, batch 8), from the same
    weights and batches: bf16 autocast's loss at every step within 5% (+0.02) of fp32's, and both
    learn (last loss below the first)."""
    data = make_tiny_imagefolder(tmp_path / "data")
    fp32, bf16 = _train_losses(None, data), _train_losses(torch.bfloat16, data)
    assert all(math.isfinite(v) for v in fp32 + bf16)
    for step, (a, b) in enumerate(zip(fp32, bf16)):
        assert abs(a - b) <= 0.05 * a + 0.02, f"step {step}: fp32 {fp32}, bf16 {bf16}"
    assert fp32[-1] < fp32[0] and bf16[-1] < bf16[0]


@pytest.mark.slow
def test_torch_compile_fullgraph_with_the_scan_op_under_autocast():
    """One graph (fullgraph=True) through the scan's custom op on its default CPU backend (traced
    by its fake kernel, AOT autograd's tracer), in fp32 and under bf16 autocast (the norms turn
    autocast off inside the graph): same outputs as eager. Inductor compiles it too, but takes
    minutes here; the GPU check measures compiled against eager."""
    torch.manual_seed(0)
    model = timm.create_model("vmamba2d_tiny", dims=16, depths=(1, 1, 1, 1)).eval()
    x = _images(1)
    for autocast in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got, want = compiled(x), model(x)
        assert got.dtype == (torch.bfloat16 if autocast else torch.float32)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
