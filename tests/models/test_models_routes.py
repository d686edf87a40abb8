"""SS2D on the four-route op: the fused path equals VMamba's per-route copies on every model,
inference buffers (the MLP reusing its hidden map, stages in batch chunks), the corner route set,
and the ERF tool drawing it."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import timm
import torch
from timm.layers import Mlp

import vmamba2d  # noqa: F401  (registers the models)
from vmamba2d.models import SS2D
from vmamba2d.models import cpu_inference
from vmamba2d.models.cpu_inference import PackedWeightConv2d
from vmamba2d.models.vmamba import PointwiseMlp
from vmamba2d.cli import erf as erf_cli


MODELS = ["vmamba2d_tiny", "vmamba2d_small", "vmamba2d_base", "vmamba_tiny", "vmamba_small", "vmamba_base"]


def _set_cross_scan(model: torch.nn.Module, mode: str) -> None:
    for module in model.modules():
        if isinstance(module, SS2D):
            module.cross_scan = mode


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """||got - expected|| / ||expected|| (Frobenius)."""
    return (torch.linalg.vector_norm(got - expected) / torch.linalg.vector_norm(expected)).item()


@pytest.mark.parametrize("name", MODELS)
def test_fused_routes_equal_per_route_copies(name):
    """Every SS2D mixer of the network gives the same output both ways (fp32, 1e-6 relative), and
    so does the network (rounding differences compound over the deeper models' 21 blocks)."""
    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    images = torch.randn(1, 3, 50, 77)
    mixer_calls = []
    hooks = [m.register_forward_hook(lambda module, args, out: mixer_calls.append((module, args[0], out)))
             for m in model.modules() if isinstance(m, SS2D)]
    with torch.no_grad():
        fused = model(images)
        for hook in hooks:
            hook.remove()
        _set_cross_scan(model, "per_route")
        per_route = model(images)
        assert len(mixer_calls) == sum(model.stages[i].blocks.__len__() for i in range(4))
        for module, mixer_input, fused_output in mixer_calls:
            assert _relative_error(fused_output, module(mixer_input)) <= 1e-6
    assert _relative_error(fused, per_route) <= (1e-6 if name.endswith("tiny") else 3e-6)


@pytest.mark.parametrize("name", ["vmamba2d_tiny", "vmamba_tiny"])
def test_fused_routes_gradients_equal_per_route_copies(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10)
    images = torch.randn(2, 3, 50, 77)
    grads = {}
    for mode in ("fused", "per_route"):
        _set_cross_scan(model, mode)
        model.zero_grad()
        model(images).square().sum().backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for param_name, grad in grads["fused"].items():
        assert _relative_error(grad, grads["per_route"][param_name]) <= 1e-5, param_name


def test_fused_routes_on_a_large_odd_map():
    torch.manual_seed(0)
    op = SS2D(48, scan="2d").eval()
    x = torch.randn(1, 48, 57, 77)  # stage-1 map of a 225 x 301 image
    with torch.no_grad():
        fused = op(x)
        op.cross_scan = "per_route"
        assert _relative_error(fused, op(x)) <= 1e-6


def test_pointwise_mlp_equals_timms_mlp_and_reuses_its_hidden_map_in_inference():
    torch.manual_seed(0)
    reference = Mlp(8, 32, act_layer=torch.nn.GELU, use_conv=True)
    ours = PointwiseMlp(8, 32)
    ours.load_state_dict(reference.state_dict())  # strict: same keys and shapes as timm's Mlp
    x = torch.randn(2, 8, 5, 7).contiguous(memory_format=torch.channels_last)
    buffers = {}
    ours.fc1.register_forward_hook(lambda module, args, out: buffers.__setitem__("fc1", out.data_ptr()))
    ours.fc2.register_forward_pre_hook(lambda module, args: buffers.__setitem__("fc2", args[0].data_ptr()))
    with torch.inference_mode():
        torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)
    assert buffers["fc2"] == buffers["fc1"]  # GELU wrote over fc1's output

    ours(x).square().sum().backward()  # with autograd GELU keeps its input
    assert buffers["fc2"] != buffers["fc1"]
    reference(x).square().sum().backward()
    for (name, got), expected in zip(ours.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=0, atol=0, msg=name)


def test_stages_infer_in_batch_chunks_with_the_whole_batch_result():
    two_samples_mib = 2 * 32 * 16 * 12 * 4 / 2**20  # two samples' MLP hidden maps in the first stage
    torch.manual_seed(0)
    whole_model = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0).eval()
    chunked_model = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0, inference_chunk_mib=two_samples_mib)
    chunked_model.load_state_dict(whole_model.state_dict())
    chunked_model.eval()
    images = torch.randn(5, 3, 64, 48)
    batches = {"whole": [], "chunked": []}
    for key, model in (("whole", whole_model), ("chunked", chunked_model)):
        model.stages[0].blocks[0].register_forward_hook(
            lambda module, args, out, key=key: batches[key].append(args[0].shape[0]))
    with torch.no_grad():
        whole, chunked = whole_model(images), chunked_model(images)
    assert batches == {"whole": [5], "chunked": [2, 2, 1]}
    assert _relative_error(chunked, whole) <= 1e-6
    chunked_model(images)  # with autograd: the whole batch at once
    assert batches["chunked"][-1] == 5
    for bad in (-1, "on", True):
        with pytest.raises(ValueError, match="inference_chunk_mib"):
            timm.create_model("vmamba2d_tiny", dims=8, inference_chunk_mib=bad)


def test_hooks_on_a_stages_blocks_fire_in_chunked_inference():
    """Hooks registered on ``stage.blocks`` (or global module hooks) see the whole batch once per
    call, as without chunks: such a stage runs unchunked."""
    two_samples_mib = 2 * 32 * 16 * 12 * 4 / 2**20
    torch.manual_seed(0)
    model = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0, inference_chunk_mib=two_samples_mib).eval()
    images = torch.randn(5, 3, 64, 48)
    with torch.no_grad():
        expected = model(images)
    blocks = model.stages[0].blocks
    seen = []
    handles = [
        blocks.register_forward_pre_hook(lambda module, args: seen.append(("pre", args[0].shape[0]))),
        blocks.register_forward_hook(lambda module, args, out: seen.append(("post", out.shape[0]))),
    ]
    with torch.no_grad():
        got = model(images)
    for handle in handles:
        handle.remove()
    assert seen == [("pre", 5), ("post", 5)]
    assert _relative_error(got, expected) <= 1e-6

    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: calls.append(out.shape[0]) if module is blocks else None)
    try:
        with torch.no_grad():
            model(images)
    finally:
        handle.remove()
    assert calls == [5]


@pytest.mark.parametrize("channels, kernel, stride, batch, size, threads", [
    (6, 3, 2, 2, (9, 8), 2), (6, 1, 1, 2, (9, 8), 2), (6, 1, 1, 2, (9, 8), 1),
    (384, 1, 1, 1, (4, 5), 2),  # a stage-3 projection at batch 1 on a 64 x 80 image
])
def test_packed_weight_conv_equals_conv2d_and_repacks_when_the_weight_changes(channels, kernel, stride, batch, size,
                                                                             threads):
    """The models' convs (PackedWeightConv2d): nn.Conv2d's result bitwise in every mode; without
    autograd on channels-last fp32 CPU maps one packed weight serves repeated calls and is remade
    whenever the weight changes; a cache, not state."""
    torch.manual_seed(0)
    conv = PackedWeightConv2d(channels, 10, kernel_size=kernel, stride=stride, padding=kernel // 2)
    reference = torch.nn.Conv2d(channels, 10, kernel_size=kernel, stride=stride, padding=kernel // 2)
    reference.load_state_dict(conv.state_dict())
    x = torch.randn(batch, channels, *size).contiguous(memory_format=torch.channels_last)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            torch.testing.assert_close(conv(x), reference(x), rtol=0, atol=0)
            packed = conv._packed_weight
            assert (packed is None) == (threads == 1 and kernel == 1)  # PyTorch's own oneDNN choice
            conv(x)
            assert conv._packed_weight is packed
            torch.testing.assert_close(conv(x[:1]), reference(x[:1]), rtol=0, atol=0)
        with torch.no_grad():
            conv.weight.mul_(-2.0)
            reference.weight.mul_(-2.0)
            torch.testing.assert_close(conv(x), reference(x), rtol=0, atol=0)
            torch.testing.assert_close(conv(x[:1]), reference(x[:1]), rtol=0, atol=0)
        conv.load_state_dict({"weight": torch.randn(10, channels, kernel, kernel), "bias": torch.randn(10)})
        reference.load_state_dict(conv.state_dict())
        conv.weight.data = conv.weight.data.double().float()  # a new tensor, same values
        with torch.no_grad():
            torch.testing.assert_close(conv(x), reference(x), rtol=0, atol=0)
            torch.testing.assert_close(conv(x.contiguous()), reference(x.contiguous()), rtol=0, atol=0)
    finally:
        torch.set_num_threads(previous_threads)
    conv(x).square().sum().backward()  # with autograd: the parameter itself
    reference(x).square().sum().backward()
    torch.testing.assert_close(conv.weight.grad, reference.weight.grad, rtol=0, atol=0)
    assert copy.deepcopy(conv)._packed_weight is None
    assert all(value.is_contiguous() for value in conv.state_dict().values())
    conv.weight = torch.nn.Parameter(torch.randn(10, channels + 1, kernel, kernel))  # another shape
    reference.weight = torch.nn.Parameter(conv.weight.detach().clone())
    wider = torch.randn(batch, channels + 1, *size).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(conv(wider), reference(wider), rtol=0, atol=0)


@pytest.mark.skipif(not cpu_inference.packed_convolution_available(), reason="needs oneDNN's packed-weight ops")
def test_a_conv_with_a_packed_weight_can_be_scripted():
    """The packed copy is an eager-inference cache: scripting after a CPU inference call (which
    fills it) works and gives nn.Conv2d's result (it failed on the cache's tuple-keyed dict)."""
    torch.manual_seed(0)
    conv = PackedWeightConv2d(6, 10, kernel_size=3, padding=1).eval()
    x = torch.randn(2, 6, 5, 4).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        eager = conv(x)
        assert conv._packed_weight is not None
        scripted = torch.jit.script(conv)(x)
    torch.testing.assert_close(scripted, eager, rtol=0, atol=0)


def test_packed_weight_conv_is_conv2d_without_onednn(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(cpu_inference, "packed_convolution_available",
                        cpu_inference.packed_convolution_available.__wrapped__)  # uncached
    conv = PackedWeightConv2d(6, 10, kernel_size=1).eval()
    x = torch.randn(2, 6, 5, 4).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        conv(x)
    assert not cpu_inference.packed_convolution_available() and conv._packed_weight is None


def test_a_model_can_stop_packing_its_conv_weights():
    torch.manual_seed(0)
    model = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0).eval()
    convs = [m for m in model.modules() if isinstance(m, PackedWeightConv2d)]
    assert len(convs) == 2 + 3 + 4 * sum(len(stage.blocks) for stage in model.stages)  # stem, downsamples, 4 per block
    images = torch.randn(2, 3, 40, 36)
    with torch.inference_mode():
        packed = model(images)
        assert all(conv._packed_weight is not None for conv in convs)
        model.set_weight_packing(False)
        assert all(conv._packed_weight is None for conv in convs)
        torch.testing.assert_close(model(images), packed, rtol=0, atol=0)
        assert all(conv._packed_weight is None for conv in convs)


def test_a_block_writes_its_result_into_out_in_inference_only():
    """The chunked stages' last block writes into the stage's output (no concatenation)."""
    torch.manual_seed(0)
    block = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0).stages[1].blocks[0].eval()
    x = torch.randn(3, 16, 6, 5)
    expected = x + block.op(block.norm(x))
    expected = expected + block.mlp(block.norm2(expected))
    out = torch.full((3, 16, 6, 5), float("nan"))
    with torch.no_grad():
        assert block(x, out=out) is out
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="inference only"):
        block(x, out=out)


def test_the_default_chunks_cpu_inference_only():
    """inference_chunk_mib="auto" (the default): 24 MiB chunks for maps on the CPU, the whole batch
    on any other device; a number applies everywhere."""
    stage = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0).stages[0]
    cpu_map, other_map = torch.empty(2, 8, 56, 56), torch.empty(2, 8, 56, 56, device="meta")
    assert stage.inference_chunk_limit(cpu_map) == 24 * 2**20
    assert stage.inference_chunk_limit(other_map) == 0
    per_sample = 32 * 56 * 56 * 4  # the MLP's hidden map (4 x 8 channels) in fp32
    size = stage.inference_chunk_size(torch.empty(200, 8, 56, 56))
    assert size * per_sample <= 24 * 2**20 < (size + 1) * per_sample * 2  # within the limit, not wastefully small
    fixed = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0, inference_chunk_mib=0).stages[0]
    assert fixed.inference_chunk_limit(cpu_map) == 0


@pytest.mark.parametrize("cross_scan, backend, widest", [
    ("fused", "cpu", 4 * 8),  # the CPU kernel projects the step sizes: the MLP's 4 x 8 hidden channels
    ("fused", "torch", 4 * 16),  # K * Di full-rank step sizes
    ("per_route", "cpu", 4 * 16),  # K * Di route copies
])
def test_chunks_are_sized_by_the_widest_map_a_block_stores(cross_scan, backend, widest):
    """ssm_ratio 2 (Di = 16 on 8 channels): the SS2D buffers are the widest unless the CPU kernel
    folds the step-size projection, which leaves no K * Di map."""
    model = timm.create_model("vmamba2d_tiny", dims=8, num_classes=0, ssm_ratio=2.0, cross_scan=cross_scan,
                              scan_backend=backend)
    stage = model.stages[0]
    x = torch.empty(200, 8, 56, 56)
    assert max(stage.blocks[0].mlp.fc1.out_channels, stage.blocks[0].op.widest_map_channels(x)) == widest
    most = 24 * 2**20 // (widest * 56 * 56 * 4)  # samples whose widest map fits the 24 MiB default
    chunks = -(-200 // most)
    assert stage.inference_chunk_size(x) == -(-200 // chunks)


def _mixer_influence(op: SS2D, size: int = 9) -> torch.Tensor:
    """|d y[centre] / d x| summed over channels for one mixer's scan (size x size)."""
    x = torch.randn(1, op.d_inner, size, size, dtype=torch.float64, requires_grad=True)
    y = op.scan_routes(x)
    y[0, :, size // 2, size // 2].sum().backward()
    return x.grad.abs().sum(1)[0]


@pytest.mark.parametrize("cross_scan", ["fused", "per_route"])
def test_corner_routes_reach_all_four_quadrants(cross_scan):
    torch.manual_seed(0)
    quadrants = {}
    for routes in ("cross", "corners"):
        op = SS2D(8, routes=routes, cross_scan=cross_scan, dtype=torch.float64)
        influence = _mixer_influence(op)
        c = influence.shape[0] // 2
        quadrants[routes] = {
            "top_left": influence[:c, :c].sum(), "bottom_right": influence[c + 1:, c + 1:].sum(),
            "top_right": influence[:c, c + 1:].sum(), "bottom_left": influence[c + 1:, :c].sum(),
        }
    assert quadrants["cross"]["top_left"] > 0 and quadrants["cross"]["bottom_right"] > 0
    assert quadrants["cross"]["top_right"] == 0 and quadrants["cross"]["bottom_left"] == 0
    assert all(mass > 0 for mass in quadrants["corners"].values())


def test_corner_routes_keep_the_checkpoint_layout():
    cross = timm.create_model("vmamba2d_tiny", num_classes=0)
    corners = timm.create_model("vmamba2d_tiny", num_classes=0, routes="corners")
    corners.load_state_dict(cross.state_dict())
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert not torch.allclose(cross.eval()(images), corners.eval()(images))
    with pytest.raises(ValueError, match="routes must be one of"):
        SS2D(8, routes="diagonal")
    with pytest.raises(ValueError, match="cross_scan must be one of"):
        SS2D(8, cross_scan="copies")


def test_erf_tool_draws_the_corner_route_model(tmp_path):
    tool = erf_cli
    args = tool.parse_args(["--models", "vmamba2d_tiny", "--random-init", "--num-images", "1", "--input-size", "64",
                            "--out", str(tmp_path), "--device", "cpu", "--model-kwargs", "routes=corners"])
    assert args.model_kwargs == {"routes": "corners"}
    tool.run(args)
    erf_map = np.load(tmp_path / "vmamba2d_tiny.npy")
    assert erf_map.shape == (64, 64) and erf_map.sum() > 0
    with pytest.raises(SystemExit):
        tool.parse_args(["--models", "vmamba2d_tiny", "--model-kwargs", "routes"])
