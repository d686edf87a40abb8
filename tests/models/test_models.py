"""VMamba / 2DVMamba timm models: architecture, any input size, timm API, weights, bad input.

Most tests use a narrow configuration of the registered models (dims=16, one block per stage) on
small inputs with the pure-PyTorch scan backend, so results do not depend on which compiled
kernels exist; parameter counts use the real variants built on the meta device.
"""
from __future__ import annotations

import math
import shutil
import sys
import types

import pytest
import safetensors.torch
import timm
import torch
import torch.nn.functional as F

import vmamba2d  # noqa: F401  (registers the models)
from timm.optim import create_optimizer_v2
from vmamba2d.models import SS2D, VMamba
from vmamba2d.ops import selective_scan_2d_reference

MODEL_NAMES = ["vmamba2d_tiny", "vmamba2d_small", "vmamba2d_base", "vmamba_tiny", "vmamba_small", "vmamba_base"]
NARROW = dict(dims=16, depths=(1, 1, 1, 1), scan_backend="torch")


def narrow_model(name: str = "vmamba2d_tiny", **kwargs) -> VMamba:
    torch.manual_seed(0)
    return timm.create_model(name, **{**NARROW, **kwargs}).eval()


def images(batch: int = 2, height: int = 64, width: int = 64, chans: int = 3) -> torch.Tensor:
    return torch.randn(batch, chans, height, width, generator=torch.Generator().manual_seed(1))


# ---------------------------------------------------------------- registration and parameters


@pytest.mark.parametrize(
    "name, published_millions",
    [("vmamba2d_tiny", 30.25), ("vmamba2d_small", 50.15), ("vmamba2d_base", 89.0),
     ("vmamba_tiny", 30.25), ("vmamba_small", 50.15), ("vmamba_base", 89.0)],
)
def test_parameter_count_matches_published(name, published_millions):
    with torch.device("meta"):
        model = timm.create_model(name)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / 1e6 - published_millions) / published_millions < 0.005, count


def test_baseline_and_2d_share_parameter_layout():
    with torch.device("meta"):
        ours, baseline = timm.create_model("vmamba2d_small"), timm.create_model("vmamba_small")
    assert ours.scan == "2d" and baseline.scan == "1d"
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in baseline.state_dict().items()}


def test_registered_names_and_default_cfg():
    assert set(MODEL_NAMES) <= set(timm.list_models("vmamba*"))
    with torch.device("meta"):
        model = timm.create_model("vmamba2d_tiny")
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (3, 224, 224) and cfg["interpolation"] == "bicubic"
    assert cfg["first_conv"] == "stem.conv1" and cfg["classifier"] == "head.fc"
    assert model.get_submodule(cfg["first_conv"]).in_channels == 3
    assert model.get_submodule(cfg["classifier"]).out_features == 1000


@pytest.mark.parametrize("name", ["vmamba2d_tiny", "vmamba_tiny"])
def test_registered_variant_forward_backward(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7)  # scan_backend="auto": the compiled kernel
    x = images(batch=1, height=32, width=32).requires_grad_()
    logits = model(x)
    assert logits.shape == (1, 7)
    logits.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_variant_scan_is_fixed():
    with pytest.raises(TypeError, match="scan"):
        timm.create_model("vmamba_tiny", scan="2d")


# ---------------------------------------------------------------- the SS2D routes


def _scan_1d_loop(u, dt, A, B, C, D):
    """Literal Mamba recurrence over a sequence: u, dt (dim, L); A (dim, N); B, C (N, L); D (dim,)."""
    h = torch.zeros_like(A)
    ys = []
    for t in range(u.shape[1]):
        h = torch.exp(dt[:, t, None] * A) * h + dt[:, t, None] * B[None, :, t] * u[:, t, None]
        ys.append((h * C[None, :, t]).sum(-1) + D * u[:, t])
    return torch.stack(ys, dim=1)


def _route_maps(x):
    """The four routes of x (Di, H, W) as maps, and functions mapping each route's output back."""
    return [
        (x, lambda y: y),
        (x.transpose(1, 2), lambda y: y.transpose(1, 2)),
        (x.flip(1, 2), lambda y: y.flip(1, 2)),
        (x.transpose(1, 2).flip(1, 2), lambda y: y.flip(1, 2).transpose(1, 2)),
    ]


def _ss2d_core_reference(op: SS2D, x: torch.Tensor) -> torch.Tensor:
    """Scan each route on its own with the literal recurrence; x (B, Di, H, W) -> (B, Di, H, W)."""
    r, n, di = op.dt_rank, op.d_state, op.d_inner
    A = -torch.exp(op.A_logs.detach().double()).view(4, di, n)
    D = op.Ds.detach().double().view(4, di)
    bias = op.dt_projs_bias.detach().double()
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for k, (route, back) in enumerate(_route_maps(x[b])):
            grid_h, grid_w = route.shape[1:]
            seq = route.reshape(di, -1)
            proj = op.x_proj_weight.detach().double()[k] @ seq  # (R + 2N, L)
            dt_raw, Bk, Ck = proj[:r], proj[r:r + n], proj[r + n:]
            dt = F.softplus(op.dt_projs_weight.detach().double()[k] @ dt_raw + bias[k][:, None])
            if op.scan == "1d":
                y = _scan_1d_loop(seq, dt, A[k], Bk, Ck, D[k])
            else:
                y = selective_scan_2d_reference(
                    seq[None], dt[None], A[k], Bk[None, None], Ck[None, None], D[k], None, False, height=grid_h, width=grid_w
                )[0]
            out[b] += back(y.reshape(di, grid_h, grid_w))
    return out


@pytest.mark.parametrize("scan", ["2d", "1d"])
@pytest.mark.parametrize("height, width", [(4, 4), (3, 5)])
def test_ss2d_routes_match_per_route_reference(scan, height, width):
    torch.manual_seed(0)
    op = SS2D(dim=8, d_state=2, ssm_ratio=1.5, scan=scan, scan_backend="torch").double()
    with torch.no_grad():  # spread the parameters so every route matters
        op.A_logs.uniform_(-1.0, 1.0)
        op.Ds.uniform_(-1.0, 1.0)
    x = torch.randn(2, op.d_inner, height, width, dtype=torch.float64)
    torch.testing.assert_close(op.scan_routes(x), _ss2d_core_reference(op, x), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("scan", ["2d", "1d"])
@pytest.mark.parametrize("height, width", [(33, 47), (17, 17)])
def test_every_ss2d_in_the_network_scans_its_own_map_on_odd_inputs(scan, height, width):
    """On inputs that are not multiples of 32 every stage's map is ceil(side / stride), square or
    not, and each SS2D's routes still match the per-route reference on that map."""
    torch.manual_seed(0)
    model = narrow_model("vmamba2d_tiny" if scan == "2d" else "vmamba_tiny", dims=8).double()
    ops = [block.op for stage in model.stages for block in stage.blocks]
    with torch.no_grad():
        for op in ops:  # spread the parameters so every route matters
            op.A_logs.uniform_(-1.0, 1.0)
            op.Ds.uniform_(-1.0, 1.0)
    seen = []
    hooks = [op.register_forward_hook(lambda module, args, out: seen.append((module, args[0]))) for op in ops]
    with torch.no_grad():
        model(images(batch=1, height=height, width=width).double())
    for hook in hooks:
        hook.remove()
    expected_maps = [(math.ceil(height / 4 / 2**i), math.ceil(width / 4 / 2**i)) for i in range(4)]
    assert [tuple(x.shape[-2:]) for _, x in seen] == expected_maps
    for op, block_input in seen:
        with torch.no_grad():
            x = op.act(op.conv2d(op.in_proj(block_input)))
            torch.testing.assert_close(op.scan_routes(x), _ss2d_core_reference(op, x), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("height, width", [(33, 47), (17, 17), (1, 1), (5, 70)])
def test_any_input_size_feature_shapes(height, width):
    """Stage i's map is ceil(side / 2^(i+2)), like the official stride-2 / padding-1 convs."""
    model = narrow_model()
    features = timm.create_model("vmamba2d_tiny", features_only=True, **NARROW).eval()
    x = images(batch=1, height=height, width=width)
    expected = [(1, 16 * 2**i, math.ceil(height / 2 ** (i + 2)), math.ceil(width / 2 ** (i + 2))) for i in range(4)]
    with torch.no_grad():
        assert [tuple(f.shape) for f in features(x)] == expected
        assert [tuple(f.shape) for f in model.forward_intermediates(x, intermediates_only=True)] == expected
        assert tuple(model.forward_features(x).shape) == expected[-1]
        logits = model(x)
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["vmamba2d_tiny", "vmamba_tiny"])
def test_auto_backend_matches_torch_backend(name):
    """The model on the default backend (compiled kernel when present) agrees with pure PyTorch."""
    auto = narrow_model(name, scan_backend="auto")
    reference = narrow_model(name)
    x = images(height=32, width=96)
    outputs, grads = [], []
    for model in (auto, reference):
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        outputs.append(out.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)
    for key in grads[1]:
        torch.testing.assert_close(grads[0][key], grads[1][key], rtol=1e-3, atol=1e-5, msg=key)


def test_bfloat16_autocast_forward():
    model = narrow_model(scan_backend="auto")
    x = images(height=32, width=64)
    with torch.no_grad():
        expected = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.1, atol=0.05)


def test_2d_and_1d_models_share_weights_but_not_scans():
    ours, baseline = narrow_model("vmamba2d_tiny"), narrow_model("vmamba_tiny")
    baseline.load_state_dict(ours.state_dict())
    x = torch.randn(2, 16, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y2d = ours.stages[0].blocks[0].op.scan_routes(x)
        y1d = baseline.stages[0].blocks[0].op.scan_routes(x)
    assert (y2d - y1d).abs().max() > 0.1 * y1d.abs().max()


# ---------------------------------------------------------------- timm API


@pytest.mark.parametrize("height, width", [(64, 64), (32, 96)])
def test_features_only_shapes(height, width):
    model = timm.create_model("vmamba2d_tiny", features_only=True, **NARROW)
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    assert model.feature_info.channels() == [16, 32, 64, 128]
    feats = model(images(height=height, width=width))
    assert [tuple(f.shape) for f in feats] == [
        (2, 16 * 2**i, height // (4 * 2**i), width // (4 * 2**i)) for i in range(4)
    ]


def test_features_only_out_indices_match_intermediates():
    model = narrow_model("vmamba_tiny")
    torch.manual_seed(0)  # same seed as narrow_model: the same weights
    features = timm.create_model("vmamba_tiny", features_only=True, out_indices=(1, 3), **NARROW).eval()
    torch.testing.assert_close(features.stem.conv1.weight, model.stem.conv1.weight)
    assert features.feature_info.reduction() == [8, 32]
    x = images(height=32, width=64)
    with torch.no_grad():
        feats = features(x)
        inters = model.forward_intermediates(x, indices=[1, 3], intermediates_only=True)
        final, all_inters = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
    assert len(all_inters) == 4
    for got, expected in zip(feats, inters):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(inters[1], all_inters[3])


def test_prune_intermediate_layers():
    model = narrow_model()
    x = images()
    with torch.no_grad():
        expected = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        kept = model.prune_intermediate_layers(indices=[0, 1])
        assert kept == [0, 1] and len(model.stages) == 2
        got = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        out = model(x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(out, expected[1])  # head (and pooling) removed, as in timm's convnext


def test_classifier_api():
    model = narrow_model(num_classes=10)
    x = images()
    assert model.get_classifier().out_features == 10
    features = model.forward_features(x)
    assert features.shape == (2, 128, 2, 2)
    pre = model.forward_head(features, pre_logits=True)
    torch.testing.assert_close(pre, features.mean((2, 3)))
    model.reset_classifier(0)
    assert model(x).shape == (2, 128)
    model.reset_classifier(5, global_pool="max")
    assert model.get_classifier().out_features == 5
    torch.testing.assert_close(model.forward_head(features, pre_logits=True), features.amax((2, 3)))
    assert narrow_model(num_classes=0)(x).shape == (2, 128)


def test_constructor_options():
    torch.manual_seed(0)
    model = timm.create_model("vmamba2d_tiny", in_chans=1, num_classes=3, drop_rate=0.5, drop_path_rate=0.3, **NARROW)
    blocks = [b for s in model.stages for b in s.blocks]
    rates = [getattr(b.drop_path, "drop_prob", 0.0) for b in blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])
    model.train()
    x = images(chans=1)
    assert not torch.equal(model(x), model(x))  # dropout / drop path active in training
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    assert model(x).shape == (2, 3)


def test_grad_checkpointing_same_gradients_and_recomputes():
    model = narrow_model().train()
    x = images()

    def gradients():
        model.zero_grad()
        model(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = gradients()
    calls = []
    handle = model.stages[2].blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    model.set_grad_checkpointing(True)
    checkpointed = gradients()
    handle.remove()
    assert len(calls) == 2  # forward once, recomputed once in backward
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, msg=name)


def test_no_weight_decay_and_group_matcher():
    model = narrow_model()
    names = dict(model.named_parameters())
    no_decay = model.no_weight_decay()
    assert no_decay and no_decay <= set(names)
    assert {n.rsplit(".", 1)[-1] for n in no_decay} == {"A_logs", "Ds"}
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert all(id(names[n]) not in decayed for n in no_decay)
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sum(len(v) for v in groups.values()) == len(names)
    assert len(timm.models.group_parameters(model, model.group_matcher(coarse=True))) == 6


def test_torch_compile_fullgraph():
    model = narrow_model()
    x = images(batch=1, height=32, width=32)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "x, error, match",
    [
        (torch.randn(3, 64, 64), ValueError, "4-D"),
        (torch.randn(1, 4, 64, 64), ValueError, "in_chans=3"),
        (torch.randn(1, 3, 0, 64), ValueError, "at least 1, got 0x64"),
        (torch.randn(1, 3, 64, 0), ValueError, "at least 1, got 64x0"),
        (torch.zeros(1, 3, 64, 64, dtype=torch.long), TypeError, "floating-point"),
        ([[1.0]], TypeError, "torch.Tensor"),
    ],
)
def test_bad_input_rejected_before_any_kernel(x, error, match, monkeypatch):
    model = narrow_model()

    def fail(*args, **kwargs):
        raise AssertionError("the scan ran on invalid input")

    monkeypatch.setattr("vmamba2d.models.ss2d.selective_scan_2d", fail)
    features = timm.create_model("vmamba2d_tiny", features_only=True, **NARROW)
    for entry in (model, model.forward_features, model.forward_intermediates, features):
        with pytest.raises(error, match=match):
            entry(x)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="scan"):
        VMamba(scan="3d")
    with pytest.raises(ValueError, match="scan_backend"):
        VMamba(scan_backend="gpu")
    with pytest.raises(ValueError, match="dims"):
        VMamba(dims=(16, 32), depths=(1, 1, 1))


# ---------------------------------------------------------------- weights


def _native_to_official(state_dict):
    """Rename a native state dict to the public VMamba v2 layout, Linear-shaped pointwise weights."""
    stem = {"conv1": "0", "norm1": "2", "conv2": "5", "norm2": "7"}
    official = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if parts[0] == "stem":
            new = f"patch_embed.{stem[parts[1]]}.{parts[2]}"
        elif parts[0] == "stages" and parts[2] == "downsample":
            index = {"conv": "1", "norm": "3"}[parts[3]]
            new = f"layers.{int(parts[1]) - 1}.downsample.{index}.{parts[4]}"
        elif parts[0] == "stages":
            new = "layers." + ".".join(parts[1:])
        elif parts[0] == "norm":
            new = "classifier.norm." + parts[1]
        else:
            assert parts[:2] == ["head", "fc"], key
            new = "classifier.head." + parts[2]
        if parts[-2] in ("in_proj", "out_proj", "fc1", "fc2") and parts[-1] == "weight":
            value = value.flatten(1)
        official[new] = value.clone()
    return official


def _random_state(model):
    generator = torch.Generator().manual_seed(3)
    return {k: torch.randn(v.shape, generator=generator) * 0.1 for k, v in model.state_dict().items()}


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_native_weights_round_trip_through_files(tmp_path, suffix):
    source = narrow_model()
    source.load_state_dict(_random_state(source))
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        safetensors.torch.save_file(source.state_dict(), str(path))
    else:
        torch.save({"model": source.state_dict(), "epoch": 3}, path)
    loaded = timm.create_model(
        "vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **NARROW
    ).eval()
    for key, value in source.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, msg=key)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), source(x))


@pytest.mark.parametrize("name", ["vmamba_tiny", "vmamba2d_tiny"])
def test_official_vmamba_layout_loads_like_native(tmp_path, name):
    native = narrow_model(name)
    native.load_state_dict(_random_state(native))
    official = _native_to_official(native.state_dict())
    assert "layers.0.downsample.1.weight" in official and "patch_embed.7.bias" in official
    assert official["layers.0.blocks.0.op.in_proj.weight"].dim() == 2
    noise = {k: v + 1.0 for k, v in official.items()}  # the EMA copy must win, as in timm
    path = tmp_path / "vssm_official.pth"
    torch.save({"model": noise, "model_ema": official, "optimizer": {}, "epoch": 299}, path)
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **NARROW).eval()
    x = images(height=32, width=64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), native(x))


def test_official_layout_with_new_classifier(tmp_path):
    native = narrow_model()
    official = _native_to_official(native.state_dict())
    path = tmp_path / "official.pth"
    torch.save({"model": official}, path)
    model = timm.create_model(
        "vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), num_classes=4, **NARROW
    )
    torch.testing.assert_close(model.stem.conv1.weight, native.stem.conv1.weight)
    assert model.get_classifier().out_features == 4


def test_mismatched_checkpoint_lists_keys(tmp_path):
    state = narrow_model().state_dict()
    del state["stages.1.blocks.0.op.A_logs"]
    state["stages.1.blocks.0.op.extra"] = torch.zeros(1)
    state["stages.3.blocks.0.op.Ds"] = torch.zeros(3)
    path = tmp_path / "bad.safetensors"
    safetensors.torch.save_file(state, str(path))
    with pytest.raises(ValueError) as info:
        timm.create_model("vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **NARROW)
    message = str(info.value)
    assert "missing keys (1): stages.1.blocks.0.op.A_logs" in message
    assert "unexpected keys (1): stages.1.blocks.0.op.extra" in message
    assert "stages.3.blocks.0.op.Ds: checkpoint (3,)" in message


def test_wrong_variant_checkpoint_rejected(tmp_path):
    path = tmp_path / "other.safetensors"
    safetensors.torch.save_file(narrow_model(depths=(1, 1, 2, 1)).state_dict(), str(path))
    with pytest.raises(ValueError, match=r"unexpected keys \(\d+\): stages\.2\.blocks\.1\."):
        timm.create_model("vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **NARROW)


# ---------------------------------------------------------------- pretrained tags

RELEASE = "https://github.com/MzeroMiko/VMamba/releases/download/%23v2cls/"
OFFICIAL_TAGS = {
    "vmamba_tiny.in1k": (RELEASE + "vssm1_tiny_0230s_ckpt_epoch_264.pth", "82.6"),
    "vmamba_small.in1k": (RELEASE + "vssm_small_0229_ckpt_epoch_222.pth", "83.6"),
    "vmamba_base.in1k": (RELEASE + "vssm_base_0229_ckpt_epoch_237.pth", "83.9"),
}


def _yacs_like_config_class() -> type:
    """A class that pickles like yacs' CfgNode (what official VMamba checkpoints store under
    "config"): a dict subclass named ``yacs.config.CfgNode`` with its flags, a set among them, in
    ``__dict__``."""

    class CfgNode(dict):
        def __init__(self, **items):
            super().__init__(**items)
            self.__dict__.update({"__immutable__": True, "__deprecated_keys__": {"OLD"}, "__new_allowed__": False})

    CfgNode.__module__, CfgNode.__qualname__ = "yacs.config", "CfgNode"
    return CfgNode


def _save_official_training_checkpoint(path, model_state, ema_state, monkeypatch):
    """An official-style training checkpoint: weights, EMA weights, optimizer / scheduler / scaler
    state and the yacs training config, as VMamba's training script writes them."""
    config_class = _yacs_like_config_class()
    fake_yacs = types.ModuleType("yacs")
    fake_yacs_config = types.ModuleType("yacs.config")
    fake_yacs_config.CfgNode = config_class
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "yacs", fake_yacs)
        patch.setitem(sys.modules, "yacs.config", fake_yacs_config)
        config = config_class(MODEL=config_class(TYPE="vssm", DEPTHS=[2, 2, 8, 2]), TAG="default")
        torch.save({
            "model": model_state, "model_ema": ema_state, "config": config, "epoch": 264,
            "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
            "lr_scheduler": {"base_values": [1e-3], "t_in_epochs": False}, "scaler": {"scale": 65536.0},
            "max_accuracy": 82.6, "max_accuracy_ema": 82.5,
        }, path)


@pytest.fixture
def fake_download(tmp_path, monkeypatch):
    """torch.hub downloads become copies of a local file (into a temporary hub cache); returns
    (function setting the file to serve, list of requested URLs)."""
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    served, requested = {}, []

    def download_url_to_file(url, dst, hash_prefix=None, progress=True):
        requested.append(url)
        shutil.copyfile(served["file"], dst)

    monkeypatch.setattr(torch.hub, "download_url_to_file", download_url_to_file)
    return (lambda path: served.update(file=path)), requested


def test_official_tags_point_at_the_vmamba_v2_release():
    assert set(timm.list_models("vmamba*", pretrained=True)) == set(OFFICIAL_TAGS)
    for name, (url, top1) in OFFICIAL_TAGS.items():
        cfg = timm.models.get_pretrained_cfg(name)
        assert cfg.url == url and cfg.license == "mit"
        assert top1 in " ".join(cfg.notes)
    for name in ("vmamba2d_tiny", "vmamba2d_small", "vmamba2d_base"):
        cfg = timm.models.get_pretrained_cfg(name)
        assert not cfg.has_weights and "No public 2DVMamba weights" in " ".join(cfg.notes)


@pytest.mark.parametrize("kwargs", [{}, {"num_classes": 5}, {"features_only": True}])
def test_official_tag_pretrained_loads_release_checkpoint(tmp_path, monkeypatch, fake_download, kwargs):
    """The whole pretrained=True path of a tag: its URL, the download, weights_only loading of an
    official training checkpoint (yacs config included), EMA weights first, our filter."""
    serve, requested = fake_download
    native = narrow_model("vmamba_tiny")
    native.load_state_dict(_random_state(native))
    official = _native_to_official(native.state_dict())
    path = tmp_path / "official.pth"
    _save_official_training_checkpoint(path, {k: v + 1.0 for k, v in official.items()}, official, monkeypatch)
    with pytest.raises(Exception, match="weights_only"):
        torch.load(path, weights_only=True)  # the yacs config needs the loader's allowance
    serve(path)

    model = timm.create_model("vmamba_tiny.in1k", pretrained=True, **NARROW, **kwargs).eval()
    assert requested == [OFFICIAL_TAGS["vmamba_tiny.in1k"][0]]
    assert model.pretrained_cfg["tag"] == "in1k"
    x = images(height=33, width=40)
    with torch.no_grad():
        if kwargs.get("features_only"):
            expected = native.forward_intermediates(x, intermediates_only=True)
            for got, want in zip(model(x), expected):
                torch.testing.assert_close(got, want)
        elif "num_classes" in kwargs:
            assert model.get_classifier().out_features == 5
            torch.testing.assert_close(model.forward_features(x), native.forward_features(x))
        else:
            torch.testing.assert_close(model(x), native(x))


def test_2dvmamba_pretrained_explains_missing_weights_and_loads_vmamba_weights(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match=r"No public 2DVMamba weights.*pretrained_cfg_overlay=dict\(file="):
        timm.create_model("vmamba2d_tiny", pretrained=True, **NARROW)
    baseline = narrow_model("vmamba_tiny")
    baseline.load_state_dict(_random_state(baseline))
    path = tmp_path / "vssm1_tiny_0230s_ckpt_epoch_264.pth"
    official = _native_to_official(baseline.state_dict())
    _save_official_training_checkpoint(path, official, official, monkeypatch)
    # as the cfg notes say: the VMamba checkpoint as a local file
    model = timm.create_model(
        "vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **NARROW
    ).eval()
    reference = narrow_model("vmamba2d_tiny")
    reference.load_state_dict(baseline.state_dict())
    x = images(height=32, width=48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))
