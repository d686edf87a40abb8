"""Object detection with mmdetection (vmamba2d.det): Mask R-CNN + a tiny 2DVMamba on a tiny COCO-format
dataset generated here (CPU, seconds): training, COCO box / mask AP through pycocotools, kill and
resume, mmdet's inference API, odd input sizes, the configs' recipe and the FLOP count."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mmdet", reason="the det extra (mmdetection, mmengine, mmcv, pycocotools) is not installed")
pytest.importorskip("pycocotools", reason="the det extra (pycocotools) is not installed")

import vmamba2d.det  # noqa: E402,F401  (before mmdet.models: installs the mmcv.ops stand-in if needed)
from mmdet.registry import MODELS  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402
from mmengine.config import Config  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402

from support.script_loading import load_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "vmamba2d" / "configs" / "det"
TINY_DET_CONFIG = CONFIGS / "mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py"
CLASSES = ("square", "triangle")
IMAGE_SIZE = (96, 128)  # height, width of the generated images
EPOCHS = 3
THREADS = 1  # bitwise comparisons across processes need the same intra-op thread count (the one_thread fixtures)

register_all_modules(init_default_scope=False)


def _load_script(name: str):
    return load_script(f"det/{name}.py", f"det_{name}")


def _build(model_cfg):
    """MODELS.build under mmdet's default scope (as the Runner does)."""
    with DefaultScope.overwrite_default_scope("mmdet"):
        return MODELS.build(model_cfg)


# ---------------------------------------------------------------------------------------------
# a tiny COCO-format dataset and a tiny Mask R-CNN config
# ---------------------------------------------------------------------------------------------
def make_tiny_coco(root: Path, images: int = 4, seed: int = 0) -> Path:
    """``root/images/*.png`` (IMAGE_SIZE, noisy background) with one filled square and one filled
    triangle each, and ``root/annotations.json`` in COCO format: their boxes (x, y, w, h) and polygon
    masks; category 1 = square, 2 = triangle."""
    import cv2

    rng = np.random.default_rng(seed)
    height, width = IMAGE_SIZE
    (root / "images").mkdir(parents=True, exist_ok=True)
    coco = {"images": [], "annotations": [],
            "categories": [{"id": i + 1, "name": name} for i, name in enumerate(CLASSES)]}
    for index in range(images):
        image = (40 + rng.integers(0, 30, (height, width, 3))).astype(np.uint8)
        for label, left in ((0, 2), (1, width // 2 + 2)):  # the square on the left, the triangle on the right
            side = int(rng.integers(28, 40))
            x0, y0 = left + int(rng.integers(0, width // 2 - side - 4)), int(rng.integers(2, height - side - 2))
            corners = ([(x0, y0), (x0 + side, y0), (x0 + side, y0 + side), (x0, y0 + side)] if label == 0
                       else [(x0 + side // 2, y0), (x0 + side, y0 + side), (x0, y0 + side)])
            polygon = np.array(corners, np.int32)
            cv2.fillPoly(image, [polygon], color=(230, 60, 60) if label == 0 else (60, 200, 230))
            coco["annotations"].append({
                "id": len(coco["annotations"]) + 1, "image_id": index + 1, "category_id": label + 1,
                "bbox": [float(x0), float(y0), float(side), float(side)], "area": float(cv2.contourArea(polygon)),
                "segmentation": [polygon.astype(float).ravel().tolist()], "iscrowd": 0})
        name = f"{index:03d}.png"
        cv2.imwrite(str(root / "images" / name), image)
        coco["images"].append({"id": index + 1, "file_name": name, "height": height, "width": width})
    (root / "annotations.json").write_text(json.dumps(coco))
    return root


_TINY_RUN = """
_base_ = [{base!r}]
data_root = {data_root!r}
model = dict(
    backbone=dict(init_cfg=None, drop_path_rate=0.0, model_kwargs=dict(dims=16, depths=(1, 1, 1, 1))),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64, num_classes=2),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(num_convs=2, in_channels=32, conv_out_channels=32, num_classes=2)),
    train_cfg=dict(rpn=dict(sampler=dict(num=64)), rpn_proposal=dict(nms_pre=200, max_per_img=100),
                   rcnn=dict(sampler=dict(num=64))),
    # score_thr 0: an untrained model's detections all reach COCOeval
    test_cfg=dict(rpn=dict(nms_pre=200, max_per_img=100), rcnn=dict(score_thr=0.0, max_per_img=20)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 96), keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 96), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
dataset = dict(data_root=data_root, ann_file='annotations.json', data_prefix=dict(img='images/'),
               metainfo=dict(classes={classes!r}))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(dataset, pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False, dataset=dict(dataset, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs={epochs}, val_interval=1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=2),
    dict(type='MultiStepLR', begin=0, end={epochs}, by_epoch=True, milestones=[{epochs}], gamma=0.1),
]
optim_wrapper = dict(optimizer=dict(lr=1e-3))
default_hooks = dict(logger=dict(interval=1))
log_processor = dict(window_size=1)
env_cfg = dict(cudnn_benchmark=False)
randomness = dict(seed=0)
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """The tiny Mask R-CNN config (backbone dims 16..128, one block per stage; 4 images, batch 2,
    3 epochs, validation after each) on a dataset generated next to it (``coco/``)."""
    root = tmp_path_factory.mktemp("det")
    data_root = make_tiny_coco(root / "coco")
    config = root / "tiny_det.py"
    config.write_text(_TINY_RUN.format(base=str(TINY_DET_CONFIG), data_root=f"{data_root}/", classes=CLASSES,
                                       epochs=EPOCHS))
    return config


@pytest.fixture(scope="module")
def trained(tiny_run, one_thread_module, tmp_path_factory) -> Path:
    """The work dir of an uninterrupted det/train.py run of the tiny config."""
    work = tmp_path_factory.mktemp("det_work") / "run"
    assert _load_script("train").main([str(tiny_run), "--work-dir", str(work)]) == 0
    return work


def _scalar_records(work: Path) -> list:
    (log,) = work.glob("*/vis_data/scalars.json")
    return [json.loads(line) for line in log.read_text().splitlines()]


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


# ---------------------------------------------------------------------------------------------
# training, evaluation, inference
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_training_loss_is_finite_and_decreases(trained):
    losses = [record["loss"] for record in _scalar_records(trained) if "loss" in record]
    assert len(losses) == EPOCHS * 2  # 4 images, batch 2
    assert all(math.isfinite(loss) for loss in losses)
    assert np.mean(losses[-2:]) < 0.7 * np.mean(losses[:2]), losses
    assert (trained / "last_checkpoint").read_text() == str(trained / f"epoch_{EPOCHS}.pth")
    assert not list(trained.glob(".*.tmp-*"))


@pytest.mark.slow
def test_test_script_reports_box_and_mask_ap_as_pycocotools_computes_them(trained, tiny_run, tmp_path, capsys):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    prefix = tmp_path / "results"
    metrics = _load_script("test").evaluate([str(tiny_run), str(trained / f"epoch_{EPOCHS}.pth"), "--work-dir",
                                             str(tmp_path / "test"), "--cfg-options",
                                             f"test_evaluator.outfile_prefix={prefix}"])
    assert "coco/bbox_mAP=" in capsys.readouterr().out
    ground_truth = COCO(str(tiny_run.parent / "coco" / "annotations.json"))
    for kind in ("bbox", "segm"):
        detections = json.loads(Path(f"{prefix}.{kind}.json").read_text())
        assert detections, kind
        evaluation = COCOeval(ground_truth, ground_truth.loadRes(detections), kind)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
        assert metrics[f"coco/{kind}_mAP"] == round(float(evaluation.stats[0]), 3)
        assert metrics[f"coco/{kind}_mAP_50"] == round(float(evaluation.stats[1]), 3)
        assert 0.0 <= metrics[f"coco/{kind}_mAP"] <= 1.0


def test_coco_metric_gives_ap_1_for_the_ground_truth(tiny_run):
    """The metric the configs use, fed the annotations as predictions: box and mask AP 1.0."""
    import pycocotools.mask as mask_utils
    from mmdet.evaluation import CocoMetric

    ann_file = tiny_run.parent / "coco" / "annotations.json"
    coco = json.loads(ann_file.read_text())
    metric = CocoMetric(ann_file=str(ann_file), metric=["bbox", "segm"])
    metric.dataset_meta = dict(classes=CLASSES)
    for image in coco["images"]:
        anns = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
        boxes = torch.tensor([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                              for a in anns])
        masks = [mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(a["segmentation"], image["height"],
                                                                            image["width"]))) for a in anns]
        metric.process({}, [dict(img_id=image["id"], ori_shape=(image["height"], image["width"]), pred_instances=dict(
            bboxes=boxes, scores=torch.ones(len(anns)), labels=torch.tensor([a["category_id"] - 1 for a in anns]),
            masks=torch.from_numpy(np.stack(masks)).bool()))])
    results = metric.evaluate(len(coco["images"]))
    assert results["coco/bbox_mAP"] == 1.0 and results["coco/segm_mAP"] == 1.0


def test_inference_api_on_an_odd_sized_image(trained, tiny_run, tmp_path):
    """mmdet.apis.init_detector / inference_detector after `import vmamba2d.det` (weights-only loading)."""
    import cv2
    from mmdet.apis import inference_detector, init_detector

    image = (np.random.default_rng(1).integers(0, 255, (75, 101, 3))).astype(np.uint8)
    path = tmp_path / "odd.png"
    cv2.imwrite(str(path), image)
    model = init_detector(str(tiny_run), str(trained / f"epoch_{EPOCHS}.pth"), device="cpu")
    result = inference_detector(model, str(path))
    predictions = result.pred_instances
    count = len(predictions)
    assert 0 < count <= 20
    assert tuple(predictions.bboxes.shape) == (count, 4) and tuple(predictions.masks.shape) == (count, 75, 101)
    assert predictions.labels.max() < len(CLASSES)
    assert torch.all((predictions.bboxes[:, 2] <= 101) & (predictions.bboxes[:, 3] <= 75))


# ---------------------------------------------------------------------------------------------
# kill and resume (the crash-safety rules of seg/train.py, for epoch-based runs)
# ---------------------------------------------------------------------------------------------
_KILLED_RUN = """
import json, os, runpy, sys
import torch
torch.set_num_threads({threads})
sys.path.insert(0, {root!r})
import vmamba2d.det
from vmamba2d.openmmlab import safe_checkpoints

def dying_commit(work_dir, checkpoint_path):
    if checkpoint_path.endswith("epoch_2.pth"):
        os._exit(137)  # killed after validating epoch 2 and writing epoch_2.pth, before the commit
    commit(work_dir, checkpoint_path)
commit = safe_checkpoints.write_last_checkpoint
safe_checkpoints.write_last_checkpoint = dying_commit
sys.argv = ["det/train.py", *json.loads(sys.argv[1])]
runpy.run_path({train!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_killed_before_a_commit_then_resumed_equals_the_uninterrupted_run(trained, tiny_run, tmp_path):
    work = tmp_path / "killed"
    script = _KILLED_RUN.format(threads=THREADS, root=str(ROOT), train=str(ROOT / "det" / "train.py"))
    killed = subprocess.run([sys.executable, "-c", script, json.dumps([str(tiny_run), "--work-dir", str(work)])],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert (work / "last_checkpoint").read_text() == str(work / "epoch_1.pth")
    assert (work / "epoch_2.pth").is_file()  # written ahead of the commit
    (first_log,) = work.glob("*/vis_data/scalars.json")
    assert any(record.get("step") == 2 and "iter" not in record for record in _scalar_records(work))

    assert _load_script("train").main([str(tiny_run), "--work-dir", str(work), "--resume"]) == 0
    assert (work / "last_checkpoint").read_text() == str(work / f"epoch_{EPOCHS}.pth")
    # the killed run's records after the commit of epoch 1 (iterations 3-4, validation 2) are gone
    records = [json.loads(line) for line in first_log.read_text().splitlines()]
    assert [r["step"] for r in records if "iter" in r] == [1, 2]
    assert [r["step"] for r in records if "iter" not in r] == [1]
    resumed, reference = _weights(work / f"epoch_{EPOCHS}.pth"), _weights(trained / f"epoch_{EPOCHS}.pth")
    assert resumed.keys() == reference.keys()
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key


def test_train_refuses_a_work_dir_with_a_run_and_reports_missing_coco_in_one_line(trained, tiny_run, tmp_path,
                                                                                  capsys):
    train = _load_script("train")
    assert train.main([str(tiny_run), "--work-dir", str(trained)]) == 2
    assert "already holds a training run" in capsys.readouterr().err
    assert train.main([str(tiny_run), "--work-dir", str(tmp_path / "new"), "--cfg-options",
                       f"train_dataloader.dataset.ann_file={tmp_path / 'none.json'}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("train.py: error: train_dataloader: annotation file") and "COCO 2017 is expected" in line


@pytest.mark.slow
def test_a_second_run_into_a_locked_work_dir_is_refused_in_one_line(tiny_run, tmp_path, capsys):
    from support.run_lock_holder import lock_held_by_another_process
    from vmamba2d.runs.run_lock import LOCK_NAME

    work = tmp_path / "work"
    with lock_held_by_another_process(work) as holder:
        assert _load_script("train").main([str(tiny_run), "--work-dir", str(work), "--resume"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("train.py: error: --work-dir") and str(work) in line
        assert f"process {holder.pid}" in line
        assert [p.name for p in work.iterdir()] == [LOCK_NAME]


@pytest.mark.slow
def test_test_and_load_from_refuse_a_checkpoint_of_another_model_in_one_line(tiny_run, tmp_path, capsys):
    classification = tmp_path / "last.pth"
    torch.save({"model": {"stem.weight": torch.zeros(8, 3, 4, 4)}}, classification)
    capsys.readouterr()
    assert _load_script("test").main([str(tiny_run), str(classification), "--work-dir", str(tmp_path / "t")]) == 2
    (line,) = [l for l in capsys.readouterr().err.splitlines() if l.startswith("test.py:")]
    assert line.startswith(f"test.py: error: checkpoint {classification} holds 0 of the model's ")
    assert "(0%; at least 90% needed)" in line
    assert _load_script("train").main([str(tiny_run), "--work-dir", str(tmp_path / "w"), "--cfg-options",
                                       f"load_from={classification}"]) == 2
    (line,) = [l for l in capsys.readouterr().err.splitlines() if l.startswith("train.py:")]
    assert line.startswith(f"train.py: error: load_from {classification} holds 0 of the model's ")


def test_a_truncated_coco_annotation_file_is_refused_before_anything_is_written(tmp_path, capsys):
    import shutil

    from vmamba2d.openmmlab import runtime

    data_root = make_tiny_coco(tmp_path / "coco")
    config = tmp_path / "tiny_det.py"
    config.write_text(_TINY_RUN.format(base=str(TINY_DET_CONFIG), data_root=f"{data_root}/", classes=CLASSES,
                                       epochs=1))
    annotations = data_root / "annotations.json"
    text = annotations.read_text()
    annotations.write_text(text[: len(text) // 2])
    capsys.readouterr()
    assert _load_script("train").main([str(config), "--work-dir", str(tmp_path / "w")]) == 2
    (line,) = [l for l in capsys.readouterr().err.splitlines() if l.startswith("train.py:")]
    assert line.startswith(f"train.py: error: train_dataloader: annotation file {annotations} (") and \
        "is not valid JSON" in line, line
    assert not (tmp_path / "w").exists()
    # above the full-parse limit only the ends are checked: the truncated copy is still caught
    with pytest.raises(runtime.BadDataError, match="does not end its JSON object"):
        runtime.check_json_file("train_dataloader", annotations, parse_limit=16)
    shutil.copy(annotations, tmp_path / "copy.json")
    (tmp_path / "copy.json").write_text(text)
    runtime.check_json_file("train_dataloader", tmp_path / "copy.json", parse_limit=16)


# ---------------------------------------------------------------------------------------------
# registration, backbone options, configs, FLOPs
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_det_registers_the_shared_backbone_and_works_without_mmseg():
    """A fresh process in which mmseg cannot be imported: vmamba2d.det still imports, and mmdet's
    registry builds the same class vmamba2d.seg registers, on any input size."""
    script = textwrap.dedent("""
        import sys
        sys.modules["mmseg"] = None  # import mmseg now raises ImportError
        import torch
        import vmamba2d.det
        from mmdet.registry import MODELS
        from vmamba2d.openmmlab.backbone import VMamba2DBackbone
        assert MODELS.get("VMamba2DBackbone") is VMamba2DBackbone
        backbone = MODELS.build(dict(type="VMamba2DBackbone", model_kwargs=dict(dims=8, depths=(1, 1, 1, 1)),
                                     out_indices=(1, 2, 3), frozen_stages=1, norm_eval=True))
        assert not any(p.requires_grad for p in backbone.model.stem.parameters())
        with torch.no_grad():
            outputs = backbone.eval()(torch.randn(1, 3, 37, 53))
        print([tuple(o.shape) for o in outputs])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # strides 8, 16, 32: ceil(37 / s) x ceil(53 / s)
    assert done.stdout.split("\n")[-2] == "[(1, 16, 5, 7), (1, 32, 3, 4), (1, 64, 2, 2)]"


def test_backbone_init_cfg_from_a_timm_checkpoint_and_from_a_detector_checkpoint(tmp_path, trained):
    import timm

    torch.manual_seed(0)
    source = timm.create_model("vmamba2d_tiny", num_classes=10, dims=16, depths=(1, 1, 1, 1))
    torch.save(source.state_dict(), tmp_path / "in1k.pth")
    backbone_cfg = dict(type="VMamba2DBackbone", model_kwargs=dict(dims=16, depths=(1, 1, 1, 1)))
    backbone = _build(dict(backbone_cfg, init_cfg=dict(type="Pretrained", checkpoint=str(tmp_path / "in1k.pth"))))
    backbone.init_weights()
    expected = {k: v for k, v in source.state_dict().items() if not k.startswith(("head.", "norm."))}
    assert all(torch.equal(backbone.model.state_dict()[k], v) for k, v in expected.items())
    # the backbone of a whole Mask R-CNN checkpoint (det/train.py's), with prefix='backbone.'
    checkpoint = trained / f"epoch_{EPOCHS}.pth"
    backbone = _build(dict(backbone_cfg, init_cfg=dict(type="Pretrained", checkpoint=str(checkpoint),
                                                       prefix="backbone.")))
    backbone.init_weights()
    detector = _weights(checkpoint)
    assert all(torch.equal(v, detector["backbone." + k]) for k, v in backbone.state_dict().items())


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("mask-rcnn_*.py")), ids=lambda p: p.stem)
def test_configs_follow_vmamba_detection_recipe(path):
    cfg = Config.fromfile(str(path), format_python_code=False)
    model_name = cfg.model.backbone.model_name
    assert path.stem.startswith("mask-rcnn_" + model_name.replace("_", "-") + "_fpn_")
    assert cfg.custom_imports.imports == ["vmamba2d.det"] and cfg.model.type == "MaskRCNN"
    assert cfg.model.backbone.drop_path_rate == (0.3 if "small" in model_name else 0.2)
    assert cfg.model.backbone.init_cfg.checkpoint == f"pretrained/{model_name}_in1k.pth"
    assert cfg.model.neck.in_channels == [96, 192, 384, 768]
    optimizer = cfg.optim_wrapper.optimizer
    assert (optimizer.type, optimizer.lr, optimizer.weight_decay) == ("AdamW", 1e-4, 0.05)
    assert cfg.optim_wrapper.paramwise_cfg.custom_keys == {"norm": dict(decay_mult=0.0)}
    assert cfg.train_dataloader.batch_size * 8 == cfg.auto_scale_lr.base_batch_size == 16
    assert cfg.train_dataloader.dataset.data_root == "data/coco/"
    assert cfg.val_evaluator.ann_file == "data/coco/annotations/instances_val2017.json"
    warmup, steps = cfg.param_scheduler
    assert (warmup.type, warmup.end, steps.type) == ("LinearLR", 1000, "MultiStepLR")
    pipeline = cfg.train_dataloader.dataset.pipeline
    if "_1x_" in path.name:
        assert (cfg.train_cfg.max_epochs, steps.milestones) == (12, [8, 11])
        assert pipeline[2] == dict(type="Resize", scale=(1333, 800), keep_ratio=True)
    else:
        assert "_ms-crop-3x_" in path.name
        assert (cfg.train_cfg.max_epochs, steps.milestones) == (36, [27, 33])
        choice = next(step for step in pipeline if step.type == "RandomChoice")
        shorts = sorted(short for _, short in choice.transforms[0][0].scales)
        assert shorts == list(range(480, 801, 32))


def test_neck_channels_are_the_backbone_outputs():
    for name in ("vmamba2d_tiny", "vmamba2d_small", "vmamba_tiny"):
        backbone = _build(dict(type="VMamba2DBackbone", model_name=name))
        assert list(backbone.out_channels) == [96, 192, 384, 768], name


@pytest.mark.slow
def test_mask_rcnn_flops_and_the_2d_scan_share_on_a_small_input():
    """det/get_flops.py's count, on 160x256 (the full 1280x800 count is in docs/detection.md): the
    backbone's scan FLOPs follow docs/scan.md (per block 4 routes x (15 + 1) L D for the 2D scan,
    4 x (9 + 1) L D for the 1D scan; N = 1, D = the stage width, L = H/s x W/s; the op also counts the
    step-size projection it folds in, 4 x D x R x L), so 2DVMamba-T exceeds
    VMamba-T by exactly 4 x 6 x L x D per block; everything else is the same network."""
    from vmamba2d.det.complexity import detector_complexity
    from vmamba2d.ops import backend_info

    if not backend_info()["cpu_extension"]:
        pytest.skip("the compiled CPU scan kernel is not available: the scan op cannot be traced")
    height, width = 160, 256
    widths, depths = (96, 192, 384, 768), (2, 2, 8, 2)
    lengths = [(height // s) * (width // s) for s in (4, 8, 16, 32)]
    results = {}
    for name, per_block in (("vmamba2d_tiny", 16), ("vmamba_tiny", 10)):
        cfg = Config.fromfile(str(TINY_DET_CONFIG), format_python_code=False)
        cfg.model.backbone.update(model_name=name, init_cfg=None)
        torch.manual_seed(0)
        results[name] = result = detector_complexity(_build(cfg.model), (height, width))
        scan = result["flops_by_operator"]["cross_selective_scan_2d_fwd"]
        # plus the step-size projection the op folds in: 4 routes x D x R x L, R = D / 16
        projection = sum(4 * n * length * dim * (dim // 16) for n, length, dim in zip(depths, lengths, widths))
        scans = sum(4 * per_block * n * length * dim for n, length, dim in zip(depths, lengths, widths))
        assert scan == scans + projection, name
        assert result["params"] == pytest.approx(49.76e6, abs=0.05e6)  # VMamba's Mask R-CNN + VMamba-T: 50M
        assert 0 < result["proposals"] <= 1000 and result["flops"] > result["backbone_flops"]
    extra = sum(4 * 6 * n * length * dim for n, length, dim in zip(depths, lengths, widths))
    difference = results["vmamba2d_tiny"]["backbone_flops"] - results["vmamba_tiny"]["backbone_flops"]
    assert difference == extra
    print(f"Mask R-CNN at {height}x{width}: 2DVMamba-T {results['vmamba2d_tiny']['flops'] / 1e9:.2f}G, "
          f"VMamba-T {results['vmamba_tiny']['flops'] / 1e9:.2f}G; the 2D scan adds {extra / 1e9:.3f}G")


@pytest.mark.slow
def test_mmdet_tools_run_after_import_and_get_flops_counts_the_scan(tiny_run, capsys, monkeypatch, tmp_path):
    """mmdet's own get_flops tool (mmengine's counter, on a dataset image) prints the FLOPs
    det/get_flops.py counts (fvcore); backbone dims 64 make the scan a visible share."""
    from mmengine.analysis.print_helper import _format_size
    from vmamba2d.det.complexity import detector_complexity
    from vmamba2d.det.mmdet_tools import resolve_tool, run_tool
    from vmamba2d.ops import backend_info

    if not backend_info()["cpu_extension"]:
        pytest.skip("the compiled CPU scan kernel is not available: the scan op cannot be traced")
    assert resolve_tool("print_config").name == "print_config.py"
    monkeypatch.chdir(tmp_path)
    # NMS off (IoU threshold 1): the RPN keeps max_per_img = 100 proposals on any image, so the RoI
    # heads' share is the same on the tool's dataset image and on det/get_flops.py's blank one
    wide = ["model.backbone.model_kwargs.dims=64", "model.neck.in_channels=[64,128,256,512]",
            "model.test_cfg.rpn.nms.iou_threshold=1.0"]
    run_tool("analysis_tools/get_flops.py", [str(tiny_run), "--num-images", "1", "--cfg-options", *wide])
    printed = capsys.readouterr().out
    cfg = Config.fromfile(str(tiny_run))
    cfg.model.backbone.model_kwargs.dims = 64
    cfg.model.neck.in_channels = [64, 128, 256, 512]
    cfg.model.test_cfg.rpn.nms.iou_threshold = 1.0
    reference = detector_complexity(_build(cfg.model), IMAGE_SIZE)
    scan = reference["flops_by_operator"]["cross_selective_scan_2d_fwd"]
    assert reference["proposals"] == 100
    assert _format_size(reference["flops"] - scan) != _format_size(reference["flops"])
    assert f"Flops: {_format_size(reference['flops'])}\n" in printed
    assert f"Input shape: {IMAGE_SIZE}" in printed


@pytest.mark.slow
def test_get_flops_is_reproducible_on_a_random_detector(capsys):
    """det/get_flops.py seeds the random model it builds: the RoI heads' FLOPs scale with the number
    of proposals the untrained RPN keeps, which otherwise changes from run to run."""
    from vmamba2d.det.commands import FLOPS
    from vmamba2d.ops import backend_info

    if not backend_info()["cpu_extension"]:
        pytest.skip("the compiled CPU scan kernel is not available: the scan op cannot be traced")
    args = [str(TINY_DET_CONFIG), "--shape", "128", "--cfg-options", "model.backbone.init_cfg=None"]
    first = FLOPS.main(args)
    torch.rand(7)  # moves the global generator on, as anything run before the tool would
    second = FLOPS.main(args)
    capsys.readouterr()
    assert (first["proposals"], first["flops"]) == (second["proposals"], second["flops"])
