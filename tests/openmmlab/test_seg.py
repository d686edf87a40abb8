"""mmsegmentation integration: mmcv-lite stand-in, checkpoint allow-list, backbone, configs,
train / resume / test / TTA entry points, parity of the UperNet + 2DVMamba-T model (CPU)."""
from __future__ import annotations

import io
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mmseg", reason="the seg extra (mmsegmentation, mmengine, mmcv) is not installed")

import vmamba2d.seg  # noqa: E402  (before mmseg.models: installs the mmcv.ops stand-in if needed)
from mmengine.config import Config  # noqa: E402
from mmengine.logging import HistoryBuffer  # noqa: E402
from mmengine.model import revert_sync_batchnorm  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402
from mmseg.utils import register_all_modules  # noqa: E402
from vmamba2d.openmmlab.mmcv_standin.install import compiled_mmcv_ops_available  # noqa: E402

from support.seg_runs import TINY_CONFIG, TINY_DIMS, build, load_seg_script, run_options, tiny_model_options  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "vmamba2d" / "configs" / "seg").glob("upernet_*.py"))

register_all_modules(init_default_scope=False)


# ---------------------------------------------------------------------------------------------
# mmcv-lite stand-in
# ---------------------------------------------------------------------------------------------
needs_compat = pytest.mark.skipif(compiled_mmcv_ops_available(),
                                  reason="a full mmcv build is installed: the stand-in is not used")


@needs_compat
def test_compat_layer_is_active_and_mmseg_models_import():
    import mmseg.models  # noqa: F401  (fails on mmcv-lite without the stand-in)

    assert vmamba2d.seg.compat_layer_active()
    assert MODELS.get("VMamba2DBackbone") is vmamba2d.seg.VMamba2DBackbone


@needs_compat
def test_compat_ops_mmseg_imports_but_upernet_never_calls_raise_clearly():
    """point_sample (point heads) and sigmoid_focal_loss (focal loss) import for mmseg's modules;
    called, they name the op and how to get it."""
    from mmseg.models.decode_heads import point_head
    from mmseg.models.losses import focal_loss

    torch.manual_seed(0)
    with pytest.raises(NotImplementedError,
                       match=r"^mmcv\.ops\.point_sample is not available without full mmcv \(pip install mmcv"):
        point_head.point_sample(torch.randn(1, 3, 5, 7), torch.rand(1, 2, 2))
    with pytest.raises(NotImplementedError,
                       match=r"^mmcv\.ops\.sigmoid_focal_loss is not available without full mmcv \(pip install mmcv"):
        focal_loss._sigmoid_focal_loss(torch.randn(6, 4), torch.tensor([0, 3, 1, 4, 2, 3]), 2.0, 0.25, None, "none")


@needs_compat
def test_compat_compiled_only_ops_fail_clearly():
    from mmcv.ops import PSAMask

    with pytest.raises(NotImplementedError, match="PSAMask.*compiled"):
        PSAMask("collect", (3, 3))
    with pytest.raises(ImportError, match="nms_rotated"):
        from mmcv.ops import nms_rotated  # noqa: F401


# ---------------------------------------------------------------------------------------------
# weights_only checkpoint loading
# ---------------------------------------------------------------------------------------------
class _Exploit:
    def __reduce__(self):
        return getattr, (HistoryBuffer, "__init__")


def test_weights_only_load_of_mmengine_objects_and_nothing_more():
    buffer = HistoryBuffer()
    buffer.update(1.5)
    buffer.update(2.5, count=2)  # mean = sum of values / sum of counts
    stream = io.BytesIO()
    torch.save({"log": buffer, "eta": np.float64(3.0), "best": np.float32(0.5),
                "ids": np.arange(3, dtype=np.int64)}, stream)
    stream.seek(0)
    loaded = torch.load(stream, weights_only=True)
    assert loaded["log"].mean() == pytest.approx(4.0 / 3.0) and loaded["log"].current() == 2.5
    assert loaded["eta"] == 3.0 and loaded["best"] == np.float32(0.5)
    np.testing.assert_array_equal(loaded["ids"], [0, 1, 2])

    for forbidden in (_Exploit(), np.array([object()], dtype=object)):
        stream = io.BytesIO()
        torch.save({"x": forbidden}, stream)
        stream.seek(0)
        with pytest.raises(pickle.UnpicklingError):
            torch.load(stream, weights_only=True)


# ---------------------------------------------------------------------------------------------
# backbone
# ---------------------------------------------------------------------------------------------
def _tiny_backbone(**kwargs):
    from vmamba2d.seg import VMamba2DBackbone

    return VMamba2DBackbone("vmamba2d_tiny", model_kwargs=dict(dims=TINY_DIMS[0], depths=(1, 1, 1, 1)), **kwargs)


def test_backbone_outputs_any_input_size_as_the_padded_input():
    torch.manual_seed(0)
    backbone = _tiny_backbone().eval()
    image = torch.randn(1, 3, 70, 90)
    with torch.no_grad():
        outputs = backbone(image)
        # reference: pad to 96 x 96 by hand, run the timm model, crop, apply the output norms
        padded = torch.nn.functional.pad(image, (0, 6, 0, 26))
        features = backbone.model.forward_intermediates(padded, indices=[0, 1, 2, 3], intermediates_only=True)
    assert [tuple(o.shape) for o in outputs] == [(1, 16, 18, 23), (1, 32, 9, 12), (1, 64, 5, 6), (1, 128, 3, 3)]
    for output, feature, norm in zip(outputs, features, backbone.out_norms):
        torch.testing.assert_close(output, norm(feature[..., : output.shape[2], : output.shape[3]]))
    assert backbone.out_channels == TINY_DIMS
    # every parameter is used (DDP without find_unused_parameters)
    backbone.train()
    sum(o.sum() for o in backbone(torch.randn(1, 3, 64, 64))).backward()
    assert all(p.grad is not None for p in backbone.parameters())


def test_backbone_arguments_are_checked():
    with pytest.raises(ValueError, match="model_name"):
        _tiny_backbone_named("vmamba2d_tinyy")
    with pytest.raises(ValueError, match="out_indices"):
        _tiny_backbone(out_indices=(0, 4))
    with pytest.raises(ValueError, match="init_cfg"):
        _tiny_backbone(init_cfg=dict(type="Kaiming"))
    with pytest.raises(ValueError, match="drop_path_rate"):
        _tiny_backbone(drop_path_rate=1.5)
    subset = _tiny_backbone(out_indices=(1, 2), with_cp=True)
    assert len(subset.model.stages) == 3 and subset.model.grad_checkpointing
    assert [o.shape[1] for o in subset(torch.randn(1, 3, 64, 64))] == [32, 64]


def _tiny_backbone_named(name):
    from vmamba2d.seg import VMamba2DBackbone

    return VMamba2DBackbone(name)


def _official_name(native: str) -> str:
    """Our parameter name -> the public VMamba v2 code's name (docs/models.md, checkpoint layout)."""
    import re

    stem = {"conv1": "0", "norm1": "2", "conv2": "5", "norm2": "7"}
    if match := re.fullmatch(r"stem\.(\w+)\.(\w+)", native):
        return f"patch_embed.{stem[match[1]]}.{match[2]}"
    if match := re.fullmatch(r"stages\.(\d+)\.downsample\.(conv|norm)\.(\w+)", native):
        return f"layers.{int(match[1]) - 1}.downsample.{'1' if match[2] == 'conv' else '3'}.{match[3]}"
    if match := re.fullmatch(r"stages\.(\d+)\.blocks\.(.+)", native):
        return f"layers.{match[1]}.blocks.{match[2]}"
    return {"norm.weight": "classifier.norm.weight", "norm.bias": "classifier.norm.bias",
            "head.fc.weight": "classifier.head.weight", "head.fc.bias": "classifier.head.bias"}[native]


def test_backbone_loads_imagenet_checkpoints(tmp_path):
    import timm
    from mmengine.logging import MMLogger

    torch.manual_seed(0)
    source = timm.create_model("vmamba2d_tiny", dims=TINY_DIMS[0], depths=(1, 1, 1, 1), num_classes=10)
    path = tmp_path / "in1k.pth"
    torch.save({"model": source.state_dict(), "epoch": 3}, path)
    backbone = _tiny_backbone(init_cfg=dict(type="Pretrained", checkpoint=str(path)))
    MMLogger.get_instance("vmamba2d-test-seg")
    backbone.init_weights()
    loaded = backbone.model.state_dict()
    for key, value in loaded.items():
        torch.testing.assert_close(value, source.state_dict()[key])
    assert len(loaded) == len(source.state_dict()) - 4  # final norm (2) and classifier (2) dropped

    # the same weights in the public VMamba v2 layout (Linear pointwise weights, classifier.*)
    official = {_official_name(key): value.flatten(1) if value.dim() == 4 and value.shape[2:] == (1, 1) else value
                for key, value in source.state_dict().items()}
    assert any(k.startswith("classifier.head") for k in official)
    torch.save({"model": official}, tmp_path / "official.pth")
    from_official = _tiny_backbone(pretrained=str(tmp_path / "official.pth"))
    from_official.init_weights()
    for key, value in from_official.model.state_dict().items():
        torch.testing.assert_close(value, source.state_dict()[key])

    wrong = timm.create_model("vmamba2d_tiny", dims=8, depths=(1, 1, 1, 1))
    torch.save({"model": wrong.state_dict()}, tmp_path / "wrong.pth")
    with pytest.raises(ValueError, match="shape mismatches"):
        _tiny_backbone(pretrained=str(tmp_path / "wrong.pth")).init_weights()
    torch.save({"model": source.state_dict(), "args": _Exploit()}, tmp_path / "pickled.pth")
    with pytest.raises(ValueError, match="trusted=True"):
        _tiny_backbone(pretrained=str(tmp_path / "pickled.pth")).init_weights()
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        _tiny_backbone(pretrained=str(tmp_path / "missing.pth")).init_weights()


# ---------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_configs_follow_the_recipe_and_build():
    assert [c.name for c in CONFIGS] == [
        "upernet_vmamba2d_small_4xb4-160k_ade20k-512x512.py",
        "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py",
        "upernet_vmamba_small_4xb4-160k_ade20k-512x512.py",
        "upernet_vmamba_tiny_4xb4-160k_ade20k-512x512.py",
    ]
    for path in CONFIGS:
        cfg = Config.fromfile(str(path))
        size = "tiny" if "_tiny_" in path.name else "small"
        scan = "vmamba2d" if "vmamba2d" in path.name else "vmamba"
        backbone = cfg.model.backbone
        assert backbone.model_name == f"{scan}_{size}"
        assert backbone.drop_path_rate == {"tiny": 0.2, "small": 0.3}[size]
        assert cfg.custom_imports.imports == ["vmamba2d.seg"]
        assert cfg.train_cfg.max_iters == 160000 and cfg.train_dataloader.batch_size == 4
        optimizer = cfg.optim_wrapper.optimizer
        assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ("AdamW", 6e-5, 0.01)
        assert cfg.param_scheduler[0].end == 1500 and cfg.param_scheduler[1].power == 1.0
        assert cfg.crop_size == (512, 512) and cfg.model.decode_head.num_classes == 150
        assert cfg.model.auxiliary_head.in_index == 2 and cfg.model.auxiliary_head.loss_decode.loss_weight == 0.4
        model = build(cfg.model)
        assert list(model.backbone.out_channels) == list(cfg.model.decode_head.in_channels) == [96, 192, 384, 768]
        # stochastic depth rises linearly over all blocks: the last block has the config's rate
        assert model.backbone.model.stages[3].blocks[-1].drop_path.drop_prob == pytest.approx(backbone.drop_path_rate)
        if path == TINY_CONFIG:
            params = sum(p.numel() for p in model.parameters())
            assert params == pytest.approx(62e6, abs=1.5e6), params  # VMamba-T anchor: 62M


@pytest.mark.slow
def test_upernet_2dvmamba_tiny_flops_at_512x2048_match_the_paper():
    """fvcore trace of the whole segmentor at 512x2048 (~40 s of CPU): 950G in the paper."""
    from vmamba2d.ops import backend_info
    from vmamba2d.openmmlab.complexity import segmentor_complexity

    if not backend_info()["cpu_extension"]:
        pytest.skip("the compiled CPU scan kernel is not available: the scan op cannot be traced")
    cfg = Config.fromfile(str(TINY_CONFIG))
    result = segmentor_complexity(build(cfg.model), (512, 2048))
    assert result["params"] == pytest.approx(62e6, abs=1.5e6)
    assert result["flops"] == pytest.approx(950e9, rel=0.03), result["flops"]
    # scans, by the FLOPs convention of docs/scan.md: 4 routes x (15 L Di N + L Di) per block,
    # Di = dim (ssm_ratio 1), N = 1, L = (512 / stride) x (2048 / stride), dims 96..768, depths 2, 2, 8, 2;
    # plus the step-size projection the op folds in, 4 routes x Di x R x L with R = Di / 16
    expected_scan = sum(depth * 4 * (16 + dim // 16) * (512 // stride) * (2048 // stride) * dim
                        for depth, stride, dim in zip((2, 2, 8, 2), (4, 8, 16, 32), (96, 192, 384, 768)))
    assert result["flops_by_operator"]["cross_selective_scan_2d_fwd"] == expected_scan  # one four-route op per block


def test_optimizer_excludes_norms_and_ssm_parameters_from_weight_decay():
    from mmengine.optim import build_optim_wrapper

    cfg = Config.fromfile(str(TINY_CONFIG))
    cfg.merge_from_dict(dict(_options_to_dict(tiny_model_options())))
    model = revert_sync_batchnorm(build(cfg.model))
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {id(p): group["weight_decay"] for group in wrapper.optimizer.param_groups for p in group["params"]}
    norm_types = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm)
    norm_params = {id(p) for m in model.modules() if isinstance(m, norm_types) for p in m.parameters(recurse=False)}
    names = dict(model.named_parameters())
    for name, param in names.items():
        no_decay = name.endswith((".A_logs", ".Ds")) or id(param) in norm_params
        assert decay[id(param)] == (0.0 if no_decay else 0.01), name
    assert any(n.endswith(".A_logs") for n in names) and any("out_norms" in n for n in names)
    assert sum(1 for n in names if n.endswith("out_norm.weight")) == 4  # SS2D's LayerNorm2d, one per block


def _options_to_dict(options: list) -> dict:
    from mmengine.config import DictAction

    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--o", nargs="+", action=DictAction)
    return parser.parse_args(["--o", *options]).o


# ---------------------------------------------------------------------------------------------
# entry points: train -> resume -> test (single-scale, TTA); errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_train_validate_resume_and_test(ade_root, tmp_path, capsys, monkeypatch):
    # torch.load without weights_only unpickles anything (torch < 2.6): the resume and the test still
    # load these genuine checkpoints, with weights_only=True (vmamba2d.openmmlab.checkpoint_safety)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    train = load_seg_script("train")
    test = load_seg_script("test")
    work_dir = tmp_path / "work"
    # the config's ImageNet init (pretrained/vmamba2d_tiny_in1k.pth) replaced by --from-scratch
    from_scratch = [o for o in run_options(ade_root, max_iters=2) if o != "model.backbone.init_cfg=None"]
    train.train([str(TINY_CONFIG), "--from-scratch", "--work-dir", str(work_dir), "--cfg-options", *from_scratch])
    options = run_options(ade_root, max_iters=2)
    checkpoint = work_dir / "iter_2.pth"
    assert checkpoint.is_file()
    saved = torch.load(checkpoint, weights_only=True)  # mmengine checkpoint under weights_only
    assert saved["meta"]["iter"] == 2
    val_miou = saved["message_hub"]["log_scalars"]["val/mIoU"].current()  # validation after iteration 2
    assert 0.0 <= val_miou <= 100.0

    time.sleep(1.1)  # mmengine names runs by the second
    options = run_options(ade_root, max_iters=3)
    train.train([str(TINY_CONFIG), "--work-dir", str(work_dir), "--resume", "--cfg-options", *options])
    resumed = torch.load(work_dir / "iter_3.pth", weights_only=True)
    assert resumed["meta"]["iter"] == 3
    history = resumed["message_hub"]["log_scalars"]["train/loss"]
    assert len(history._log_history) == 3  # 2 iterations before the resume, 1 after

    time.sleep(1.1)
    capsys.readouterr()
    metrics = test.evaluate([str(TINY_CONFIG), str(work_dir / "iter_3.pth"), "--work-dir", str(tmp_path / "ss"),
                             "--cfg-options", *options])
    assert 0.0 <= metrics["mIoU"] <= 100.0 and 0.0 <= metrics["aAcc"] <= 100.0
    # the summary line: every scalar metric (mmseg returns numpy float32 scalars), 2 decimals
    summary = f"{TINY_CONFIG.name} (single-scale): " + ", ".join(
        f"{key}={float(metrics[key]):.2f}" for key in ("aAcc", "mIoU", "mAcc"))
    assert summary + "\n" in capsys.readouterr().out
    time.sleep(1.1)
    tta_options = options + ["tta_scale_factors=[0.5,1.0]"]
    metrics_tta = test.evaluate([str(TINY_CONFIG), str(work_dir / "iter_3.pth"), "--tta", "--work-dir",
                                 str(tmp_path / "tta"), "--cfg-options", *tta_options])
    assert 0.0 <= metrics_tta["mIoU"] <= 100.0


def test_inference_on_a_non_square_ade20k_sized_image():
    from mmseg.apis import inference_model, init_model

    cfg = Config.fromfile(str(TINY_CONFIG))
    cfg.merge_from_dict(_options_to_dict(tiny_model_options()))
    model = revert_sync_batchnorm(init_model(cfg, device="cpu"))
    image = np.random.default_rng(0).integers(0, 255, (512, 683, 3), dtype=np.uint8)
    result = inference_model(model, image)
    assert tuple(result.pred_sem_seg.data.shape) == (1, 512, 683)
    assert tuple(result.seg_logits.data.shape) == (150, 512, 683)


def test_metrics_summary_takes_numpy_scalars():
    from vmamba2d.openmmlab.runtime import metrics_summary, scalar_metrics

    metrics = {"aAcc": np.float32(81.2), "mIoU": np.float64(40.054), "mAcc": np.round(np.float32(52.1), 2),
               "count": 3, "flag": True, "per_class": {"wall": 70.0}}
    assert scalar_metrics(metrics) == pytest.approx({"aAcc": 81.2, "mIoU": 40.054, "mAcc": 52.1, "count": 3.0})
    assert metrics_summary(metrics) == "aAcc=81.20, mIoU=40.05, mAcc=52.10, count=3.00"
    with pytest.raises(ValueError, match="no scalar metric"):
        metrics_summary({"per_class": {}})


def test_missing_imagenet_weights_stop_training_before_anything_is_built(tmp_path, monkeypatch):
    train = load_seg_script("train")
    monkeypatch.chdir(tmp_path)  # no pretrained/ folder here
    # the dataset is missing too: the weights are checked first, with the ways out in the message
    with pytest.raises(FileNotFoundError, match=r"pretrained/vmamba2d_tiny_in1k\.pth.*init_cfg\.checkpoint=PATH"
                                                r".*--from-scratch"):
        train.train([str(TINY_CONFIG), "--work-dir", str(tmp_path / "work")])
    assert not (tmp_path / "work").exists()
    # --from-scratch gets past the weights, to the next check (the dataset)
    with pytest.raises(FileNotFoundError, match="images/training"):
        train.train([str(TINY_CONFIG), "--from-scratch", "--work-dir", str(tmp_path / "work")])
    # a checkpoint that exists passes
    Path("pretrained").mkdir()
    Path("pretrained/vmamba2d_tiny_in1k.pth").touch()
    with pytest.raises(FileNotFoundError, match="images/training"):
        train.train([str(TINY_CONFIG), "--work-dir", str(tmp_path / "work")])


def test_missing_dataset_and_bad_config_keys_fail_clearly(ade_root, tmp_path):
    train = load_seg_script("train")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--amp needs a CUDA device"):
            train.train([str(TINY_CONFIG), "--amp", "--work-dir", str(tmp_path), "--cfg-options",
                         *run_options(ade_root, max_iters=2)])
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="images/training"):
        train.train([str(TINY_CONFIG), "--from-scratch", "--work-dir", str(tmp_path), "--cfg-options",
                     f"train_dataloader.dataset.data_root={missing}"])
    with pytest.raises(FileNotFoundError, match="config file"):
        train.train([str(tmp_path / "no_config.py")])
    cfg = Config.fromfile(str(TINY_CONFIG))
    cfg.merge_from_dict({"model.backbone.window_size": 7})
    with pytest.raises(TypeError, match="window_size"):
        build(cfg.model)
    cfg = Config.fromfile(str(TINY_CONFIG))
    cfg.merge_from_dict({"model.backbone.model_name": "vmamba2d_huge"})
    with pytest.raises(ValueError, match="model_name"):
        build(cfg.model)
