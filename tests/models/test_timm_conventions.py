"""The models against timm's own conventions: factory device / dtype, reset_classifier placement,
FX feature extraction (timm's and torchvision's), and the checks timm's tests/models/test_models.py runs on
every timm model (forward, backward, default cfg, features_only, forward_intermediates), on small
configurations of our registered models, TorchScript included (scripted models call the compiled
scan kernel of the input's device)."""
from __future__ import annotations

import math

import pytest
import timm
import torch
from timm.layers import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

import vmamba2d  # noqa: F401  (registers the models)
from vmamba2d.models import SS2D

MODEL_NAMES = ["vmamba2d_tiny", "vmamba_tiny"]
# Narrow variants: dims 16, one block per stage; the pure-PyTorch scan makes results independent of
# which compiled kernels exist.
NARROW = dict(dims=16, depths=(1, 1, 1, 1), scan_backend="torch")


def images(batch: int = 1, height: int = 64, width: int = 64, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(1), dtype=dtype)


def create(name: str = "vmamba2d_tiny", **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, **{**NARROW, **kwargs})


# ---------------------------------------------------------------- factory device / dtype


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_create_on_meta_then_to_empty_and_init_weights(name):
    model = create(name, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    model.to_empty(device="cpu")
    model.init_weights()
    ops = [m for m in model.modules() if isinstance(m, SS2D)]
    for op in ops:  # Mamba's SSM initialisation (docs/models.md)
        expected_a = torch.log(torch.arange(1, op.d_state + 1, dtype=torch.float32)).expand_as(op.A_logs)
        torch.testing.assert_close(op.A_logs.detach(), expected_a)
        assert torch.equal(op.Ds.detach(), torch.ones_like(op.Ds))
        dt = torch.nn.functional.softplus(op.dt_projs_bias.detach())
        assert dt.min() >= 1e-4 - 1e-7 and dt.max() <= 0.1 + 1e-6
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            assert torch.equal(module.weight, torch.ones_like(module.weight)) and not module.bias.any()
    pointwise = torch.cat([m.weight.flatten() for m in model.modules()
                           if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1)])
    assert abs(pointwise.std().item() - 0.02) < 0.002 and abs(pointwise.mean().item()) < 0.002  # trunc_normal(0.02)
    assert not model.head.fc.bias.any()
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(images())).all()


def test_meta_model_loads_a_state_dict_like_a_normal_one():
    source = create().eval()
    model = create(device="meta")
    model.to_empty(device="cpu")
    model.load_state_dict(source.state_dict())
    x = images(height=40, width=24)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), source(x))


def test_dtype_argument_builds_every_parameter_in_that_dtype():
    model = create(dtype=torch.float64).eval()
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    reference = create().eval()
    model.load_state_dict(reference.state_dict())
    x = images(height=36, width=20)
    with torch.no_grad():
        got = model(x.double())
        torch.testing.assert_close(got, reference(x).double(), rtol=1e-4, atol=1e-5)
    assert got.dtype == torch.float64


# ---------------------------------------------------------------- reset_classifier


@pytest.mark.parametrize("factory", [dict(dtype=torch.float64), dict(device="meta")])
def test_reset_classifier_builds_the_head_like_the_model(factory):
    model = create(**factory)
    model.reset_classifier(0)  # no classifier parameters left to copy the placement from
    model.reset_classifier(10)
    reference = next(model.stem.parameters())
    fc = model.get_classifier()
    assert fc.out_features == 10
    assert fc.weight.dtype == reference.dtype and fc.weight.device == reference.device
    model.reset_classifier(4, global_pool="max")
    assert model.get_classifier().weight.dtype == reference.dtype
    assert model.get_classifier().weight.device == reference.device


# ---------------------------------------------------------------- FX


def _timm_fx_extractor(model, train: bool = False):
    """What timm's tests/models/test_models.py builds for its FX tests: a torchvision feature extractor
    (with timm's no-trace modules / functions) returning the graph's final node(s)."""
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    train_return_nodes = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**tracer_kwargs).trace(model)
        nodes = list(reversed(graph.nodes))
        output_inputs = [n.name for n in nodes[0]._input_nodes.keys()]
        names = [n.name for n in nodes]
        train_return_nodes = [train_nodes[-names.index(name)] for name in output_inputs]
    return create_feature_extractor(
        model, train_return_nodes=train_return_nodes, eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=tracer_kwargs
    )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_timm_fx_forward_matches_the_model_exactly(name):
    model = create(name).eval()
    x = images(height=48, width=48)
    with torch.no_grad():
        expected = model(x)
        got = torch.cat(tuple(_timm_fx_extractor(model)(x).values()))
    assert torch.equal(got, expected)


def test_timm_fx_backward_reaches_every_parameter():
    model = create(num_classes=42).train()
    num_params = sum(p.numel() for p in model.parameters())
    fx_model = _timm_fx_extractor(model, train=True)
    out = torch.cat(tuple(fx_model(images(batch=2, height=32, width=32)).values()))
    out.mean().backward()
    assert out.shape[-1] == 42 and not torch.isnan(out).any()
    assert all(p.grad is not None for p in fx_model.parameters())
    assert sum(p.grad.numel() for p in fx_model.parameters()) == num_params


def test_features_only_fx_matches_hook_features_on_any_size():
    """feature_cls="fx" traces once; the graph is shape-independent (odd and non-square inputs)."""
    fx_features = create(features_only=True, feature_cls="fx").eval()
    model = create().eval()  # same seed: the same weights
    for height, width in ((48, 48), (33, 47), (17, 90)):
        x = images(height=height, width=width)
        with torch.no_grad():
            got = fx_features(x)
            expected = model.forward_intermediates(x, intermediates_only=True)
        assert len(got) == 4
        for a, b in zip(got, expected):
            assert torch.equal(a, b)


def test_torchvision_feature_extractor_without_timm_tracer_settings():
    model = create().eval()
    extractor = create_feature_extractor(model, return_nodes={"stages.1": "stage1", "head.fc": "logits"})
    x = images(height=40, width=56)
    with torch.no_grad():
        out = extractor(x)
        torch.testing.assert_close(out["logits"], model(x), rtol=0, atol=0)
        assert out["stage1"].shape == (1, 32, 5, 7)


def test_traced_graph_still_checks_its_input():
    extractor = create_feature_extractor(create().eval(), return_nodes=["stages.3"])
    with pytest.raises(ValueError, match="in_chans=3"):
        extractor(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match="at least 1"):
        extractor(torch.randn(1, 3, 0, 32))


# ---------------------------------------------------------------- timm's per-model checks


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_timm_default_cfg_checks(name):
    """timm test_model_default_cfgs: unpooled features at the cfg input size have pool_size; the
    head can be removed (pooled features) and pooling too (maps); cfg layer names exist."""
    model = create(name, scan_backend="auto").eval()  # the compiled kernel where built: 224 x 224
    cfg = model.pretrained_cfg
    x = torch.randn(1, *cfg["input_size"], generator=torch.Generator().manual_seed(0))
    small = images(height=64, width=64)
    state_dict = model.state_dict()
    with torch.no_grad():
        assert model.forward_features(x).shape[-2:] == cfg["pool_size"]
        unpooled = model.forward_features(small)
        model.reset_classifier(0)
        assert model(small).shape == (1, model.num_features)
        model.reset_classifier(0, "")
        assert model(small).shape == unpooled.shape
        headless = create(name, scan_backend="auto", num_classes=0, global_pool="").eval()
        assert headless(small).shape == unpooled.shape
    assert cfg["classifier"] + ".weight" in state_dict and cfg["first_conv"] + ".weight" in state_dict


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_timm_backward_reaches_every_parameter(name):
    model = create(name, num_classes=42).train()
    out = model(images(batch=2, height=36, width=28))
    out.mean().backward()
    assert out.shape == (2, 42) and not torch.isnan(out).any()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


def test_timm_forward_intermediates_and_features_only_agree_with_feature_info():
    model = create().eval()
    features = create(features_only=True).eval()
    x = images(height=50, width=66)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        feats = features(x)
    assert features.feature_info.channels() == [f.shape[1] for f in feats]
    for info, inter, feat in zip(model.feature_info, intermediates, feats):
        assert inter.shape == feat.shape
        assert inter.shape[-2:] == (math.ceil(50 / info["reduction"]), math.ceil(66 / info["reduction"]))
        torch.testing.assert_close(inter, feat)


# ---------------------------------------------------------------- TorchScript (timm's test_model_forward_torchscript)


def scripted(name: str, **kwargs):
    with timm.set_scriptable(True):
        model = create(name, **kwargs)
    return model, torch.jit.script(model)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_torchscript_forward_matches_the_eager_model(name):
    # timm's test: script under set_scriptable(True), one forward at 128 px. The scripted model runs
    # the compiled CPU kernel, the eager one here the independent pure-PyTorch scan.
    model, script = scripted(name)
    model.eval()
    script.eval()
    for height, width in ((128, 128), (64, 96)):  # square: one scan call per block; else two grids
        x = images(2, height, width)
        with torch.no_grad():
            got, want = script(x), model(x)
        assert got.shape == (2, model.num_classes) and not torch.isnan(got).any()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_torchscript_training_step_and_save_load_round_trip(tmp_path):
    model, script = scripted("vmamba2d_tiny", num_classes=5)
    x = images(2, 64, 96)
    model(x).square().sum().backward()
    script(x).square().sum().backward()
    for (name, eager), (_, compiled) in zip(model.named_parameters(), script.named_parameters()):
        torch.testing.assert_close(compiled.grad, eager.grad, rtol=1e-3, atol=1e-6, msg=name)
    script.eval()
    path = tmp_path / "vmamba2d_tiny.pt"
    torch.jit.save(script, str(path))
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        assert torch.equal(loaded(x), script(x))


def test_scripted_model_still_checks_its_input():
    _, script = scripted("vmamba2d_tiny")
    with pytest.raises(Exception, match="in_chans=3 channels"):
        script(torch.randn(1, 4, 32, 32))


def fx_model(model):
    """timm's _create_fx_model (eval): the traced graph's output node as a feature extractor."""
    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                         param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(model, train_return_nodes=[train_nodes[-1]],
                                    eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=tracer_kwargs)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_fx_traced_model_scripts(name):
    # timm's test_model_forward_fx_torchscript: trace with timm's tracer settings, then script.
    with timm.set_scriptable(True):
        model = create(name, scan_backend="auto").eval()
    script = torch.jit.script(fx_model(model))
    x = images(1, 64, 96)
    with torch.inference_mode():
        got = torch.cat(tuple(script(x).values()))
        want = model(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fx_features_only_model_with_feature_cfg_scripts():
    # timm's test_model_forward_torchscript_with_features_fx: feature_cfg from the caller is merged
    # into the family's (it collided before), and the fx feature model scripts.
    with timm.set_scriptable(True):
        model = create("vmamba2d_tiny", features_only=True, feature_cfg={"feature_cls": "fx"},
                       out_indices=(1, 3)).eval()
    script = torch.jit.script(model)
    x = images(1, 64, 64)
    with torch.inference_mode():
        outputs = script(x)
    assert isinstance(outputs, list) and [o.shape[1] for o in outputs] == model.feature_info.channels()
    assert [o.shape[-1] for o in outputs] == [64 // r for r in model.feature_info.reduction()]


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("cross_scan", ["fused", "per_route"])
def test_torch_export_keeps_the_scan_as_one_op_and_matches_eager(name, cross_scan):
    # torch.export (TorchScript's successor): the custom op's fake implementation lets export trace
    # through it, so the exported program holds the scan as one vmamba2d op per call.
    model = create(name, scan_backend="auto", cross_scan=cross_scan).eval()
    x = images(2, 64, 96)
    program = torch.export.export(model, (x,))
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    if cross_scan == "fused":
        # one four-route op per block (4 blocks), and no route-order copies of the map
        assert sum(t.startswith("vmamba2d.cross_selective_scan_2d_fwd") for t in targets) == 4
        assert not [t for t in targets if t.startswith(("aten.flip", "aten.cat", "aten.stack"))]
    else:
        # the 2D scan takes 2 calls per block on a non-square map (H x W and W x H grids), the 1D
        # scan one (all four routes are 1 x L lines)
        scans = [t for t in targets if t.startswith("vmamba2d.selective_scan_2d_fwd")]
        assert len(scans) == (8 if name.startswith("vmamba2d") else 4)
    with torch.no_grad():
        assert torch.equal(program.module()(x), model(x))


@pytest.mark.parametrize("out_indices", [(4,), (0, -5), ("1",)])
def test_features_only_rejects_out_indices_outside_the_stages(out_indices):
    with pytest.raises(ValueError, match=r"out_indices must hold stage indices in \[-4, 3\]"):
        timm.create_model("vmamba2d_tiny", features_only=True, out_indices=out_indices)


def test_pretrained_without_network_or_with_a_bad_overlay_file_says_what_is_wrong(tmp_path, monkeypatch):
    from urllib.error import URLError

    import timm.models._hub as hub

    def offline(*args, **kwargs):
        raise URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(hub, "download_url_to_file", offline)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))  # nothing cached
    with pytest.raises(RuntimeError, match=r"vmamba_tiny: pretrained=True could not download https://.*"
                                           r"Name or service not known.*pretrained_cfg_overlay=dict\(file=PATH\)"):
        timm.create_model("vmamba_tiny", pretrained=True)
    missing = tmp_path / "none.pth"
    with pytest.raises(RuntimeError, match=f"pretrained_cfg_overlay file {missing} does not exist"):
        timm.create_model("vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(missing)))
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(RuntimeError, match=r"empty\.pth is empty \(0 bytes\)"):
        timm.create_model("vmamba2d_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(empty)))
