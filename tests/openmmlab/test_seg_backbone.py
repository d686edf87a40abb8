"""mmseg backbone conventions of VMamba2DBackbone: frozen_stages, norm_eval, init_cfg loading of
subsets and with a prefix (CPU, tiny models)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("mmseg", reason="the seg extra (mmsegmentation, mmengine, mmcv) is not installed")

import timm  # noqa: E402
import vmamba2d.seg  # noqa: E402,F401  (before mmseg.models: installs the mmcv.ops stand-in if needed)
from mmengine.registry import DefaultScope  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402
from mmseg.utils import register_all_modules  # noqa: E402
from vmamba2d.seg import VMamba2DBackbone  # noqa: E402

register_all_modules(init_default_scope=False)
TINY = dict(dims=16, depths=(1, 1, 1, 1))


def _backbone(**kwargs) -> VMamba2DBackbone:
    return VMamba2DBackbone("vmamba2d_tiny", model_kwargs=dict(TINY), **kwargs)


def _frozen_prefixes(frozen_stages: int) -> tuple:
    """Parameter-name prefixes a frozen_stages value must freeze (all four stages are output)."""
    if frozen_stages < 0:
        return ()
    return ("model.stem.",) + tuple(p for i in range(frozen_stages) for p in (f"model.stages.{i}.", f"out_norms.{i}."))


@pytest.mark.parametrize("frozen_stages", [-1, 0, 2, 4])
def test_frozen_stages_freeze_the_stem_and_first_stages(frozen_stages):
    torch.manual_seed(0)
    backbone = _backbone(frozen_stages=frozen_stages)
    frozen = _frozen_prefixes(frozen_stages)
    for name, param in backbone.named_parameters():
        assert param.requires_grad == (not name.startswith(frozen)), name
    backbone.eval()
    backbone.train()  # what the Runner does every epoch: frozen parts must stay in eval mode
    for name, module in backbone.named_modules():
        assert module.training == (not (name + ".").startswith(frozen)), name

    # an optimizer step moves exactly the trainable parameters
    if frozen_stages < 4:
        before = {n: p.detach().clone() for n, p in backbone.named_parameters()}
        optimizer = torch.optim.SGD([p for p in backbone.parameters() if p.requires_grad], lr=0.1)
        # a random linear read-out (a plain square would be constant after the output LayerNorms)
        sum((o * torch.randn_like(o)).sum() for o in backbone(torch.randn(2, 3, 64, 64))).backward()
        optimizer.step()
        for name, param in backbone.named_parameters():
            assert (param.grad is None) == name.startswith(frozen), name
            assert torch.equal(param, before[name]) == name.startswith(frozen), name


def test_frozen_stages_run_without_stochastic_depth_in_train_mode():
    torch.manual_seed(0)
    backbone = _backbone(frozen_stages=2, drop_path_rate=0.5).train()
    image = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        train_outputs = [backbone(image) for _ in range(2)]
        eval_outputs = backbone.eval()(image)
    for train_out in train_outputs:  # frozen stages 0, 1: eval behaviour (drop-path 0.17 in stage 1)
        torch.testing.assert_close(train_out[1], eval_outputs[1])
    # stage 3 (drop-path 0.5) is trained: its train-mode output differs from the eval one
    assert not torch.allclose(train_outputs[0][3], eval_outputs[3])


def test_frozen_stages_are_checked():
    with pytest.raises(ValueError, match=r"frozen_stages must be an int in \[-1, 4\]"):
        _backbone(frozen_stages=5)
    with pytest.raises(ValueError, match=r"frozen_stages must be an int in \[-1, 2\].*out_indices=\(0, 1\)"):
        _backbone(frozen_stages=3, out_indices=(0, 1))
    with pytest.raises(ValueError, match="frozen_stages"):
        _backbone(frozen_stages=True)


def test_norm_eval_keeps_norms_in_eval_mode_and_batchnorm_statistics_fixed():
    backbone = _backbone(norm_eval=True).train()
    norms = [m for m in backbone.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and not any(m.training for m in norms)
    assert backbone.model.stages[0].blocks[0].training  # everything else trains
    assert all(p.requires_grad for p in backbone.parameters())  # norm_eval freezes no parameter

    # on a timm model with BatchNorm, the running statistics stay fixed through a train-mode forward
    resnet = VMamba2DBackbone("resnet18", out_indices=(0, 1), norm_eval=True).train()
    batch_norms = [m for m in resnet.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    saved = [m.running_mean.clone() for m in batch_norms]
    resnet(torch.randn(2, 3, 32, 32) + 3.0)
    assert all(torch.equal(m.running_mean, s) for m, s in zip(batch_norms, saved))
    unfrozen = VMamba2DBackbone("resnet18", out_indices=(0, 1)).train()
    unfrozen(torch.randn(2, 3, 32, 32) + 3.0)
    assert not torch.equal(unfrozen.model.bn1.running_mean, torch.zeros_like(saved[0]))


# ---------------------------------------------------------------------------------------------
# init_cfg: subsets, prefix
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def logged(monkeypatch) -> list:
    """(message, level) of every print_log call of the backbone module."""
    messages = []
    monkeypatch.setattr(vmamba2d.openmmlab.backbone, "print_log",
                        lambda message, logger=None, level=20: messages.append((message, level)))
    return messages


def test_subset_backbone_loads_a_full_checkpoint_and_logs_the_rest(tmp_path, logged):
    torch.manual_seed(0)
    source = timm.create_model("vmamba2d_tiny", num_classes=10, **TINY)
    torch.save({"model": source.state_dict()}, tmp_path / "in1k.pth")
    backbone = _backbone(out_indices=(0, 1, 2), init_cfg=dict(type="Pretrained", checkpoint=str(tmp_path / "in1k.pth")))
    backbone.init_weights()
    expected = source.state_dict()
    loaded = backbone.model.state_dict()
    assert loaded and all(torch.equal(value, expected[key]) for key, value in loaded.items())
    (message, level), = logged
    stage3 = sorted(k for k in expected if k.startswith("stages.3."))
    assert level == 30 and f"unexpected keys ({len(stage3)})" in message and stage3[0] in message
    assert "not built for out_indices=(0, 1, 2)" in message and "missing" not in message


def _tiny_segmentor():
    cfg = dict(
        type="EncoderDecoder",
        data_preprocessor=dict(type="SegDataPreProcessor", mean=[0.0] * 3, std=[1.0] * 3),
        backbone=dict(type="VMamba2DBackbone", model_name="vmamba2d_tiny", model_kwargs=dict(TINY)),
        decode_head=dict(type="FCNHead", in_channels=128, in_index=3, channels=8, num_convs=1, num_classes=3),
    )
    with DefaultScope.overwrite_default_scope("mmseg"):
        return MODELS.build(cfg)


def test_prefix_loads_the_backbone_of_a_whole_segmentor_checkpoint(tmp_path, logged):
    torch.manual_seed(0)
    segmentor = _tiny_segmentor()
    with torch.no_grad():  # out_norms away from their (1, 0) init, to see that they are loaded
        for param in segmentor.backbone.out_norms.parameters():
            param.uniform_(0.5, 1.5)
    path = tmp_path / "iter_100.pth"
    torch.save({"meta": {"iter": 100}, "state_dict": segmentor.state_dict()}, path)  # mmengine's layout

    backbone = _backbone(init_cfg=dict(type="Pretrained", checkpoint=str(path), prefix="backbone."))
    backbone.init_weights()
    expected = segmentor.backbone.state_dict()
    assert all(torch.equal(value, expected[key]) for key, value in backbone.state_dict().items())
    assert logged[-1][1] == 20  # nothing missing or unexpected

    subset = _backbone(out_indices=(0, 1), init_cfg=dict(type="Pretrained", checkpoint=str(path), prefix="backbone."))
    subset.init_weights()
    assert all(torch.equal(value, expected[key]) for key, value in subset.state_dict().items())
    message, level = logged[-1]
    unexpected = set(expected) - set(subset.state_dict())  # stages 2, 3 and out_norms 2, 3
    assert any(k.startswith("out_norms.3.") for k in unexpected)
    assert level == 30 and f"unexpected keys ({len(unexpected)}): model.stages.2." in message

    with pytest.raises(ValueError, match=r"no key starts with prefix='encoder\.'.*backbone\.\*"):
        _backbone(init_cfg=dict(type="Pretrained", checkpoint=str(path), prefix="encoder.")).init_weights()
    # the whole checkpoint without a prefix: nothing matches, and the error says which prefix to use
    with pytest.raises(ValueError, match=r"no key matches the model.*backbone\.\*.*prefix='backbone\.'"):
        _backbone(init_cfg=dict(type="Pretrained", checkpoint=str(path))).init_weights()
    with pytest.raises(ValueError, match="init_cfg"):
        _backbone(init_cfg=dict(type="Pretrained", checkpoint=str(path), prefix=3))


def test_missing_checkpoint_names_the_ways_out(tmp_path):
    backbone = _backbone(init_cfg=dict(type="Pretrained", checkpoint=str(tmp_path / "none.pth")))
    with pytest.raises(FileNotFoundError, match=r"none\.pth not found.*init_cfg=None.*--from-scratch"):
        backbone.init_weights()
