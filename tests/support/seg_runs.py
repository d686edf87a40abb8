"""The tiny mmsegmentation runs the seg tests share: the UperNet + 2DVMamba-T config shrunk to seconds-long
runs, the seg/ scripts loaded by path, and a tiny ADE20K-layout dataset."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from support.script_loading import REPO, load_script

TINY_CONFIG = REPO / "vmamba2d" / "configs" / "seg" / "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py"
TINY_DIMS = (16, 32, 64, 128)


def build(model_cfg):
    """MODELS.build under mmseg's default scope (as the Runner does)."""
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS

    with DefaultScope.overwrite_default_scope("mmseg"):
        return MODELS.build(model_cfg)


def load_seg_script(name: str):
    return load_script(f"seg/{name}.py", f"seg_{name}")


def tiny_model_options() -> list:
    """--cfg-options shrinking the config's model (backbone dims 16..128, one block per stage)."""
    return [
        "model.backbone.init_cfg=None",
        f"model.backbone.model_kwargs.dims={TINY_DIMS[0]}",
        "model.backbone.model_kwargs.depths=[1,1,1,1]",
        f"model.decode_head.in_channels=[{','.join(map(str, TINY_DIMS))}]",
        "model.decode_head.channels=32",
        f"model.auxiliary_head.in_channels={TINY_DIMS[2]}",
        "model.auxiliary_head.channels=16",
    ]


def run_options(data_root: Path, max_iters: int) -> list:
    """--cfg-options for a seconds-long run: 64x64 crops, batch 2, no workers, tiny dataset."""
    options = tiny_model_options() + [
        "model.data_preprocessor.size=(64,64)",
        "train_dataloader.dataset.pipeline.2.scale=(128,64)",
        "train_dataloader.dataset.pipeline.3.crop_size=(64,64)",
        "val_dataloader.dataset.pipeline.1.scale=(128,64)",
        "train_dataloader.batch_size=2",
        f"train_cfg.max_iters={max_iters}",
        "train_cfg.val_interval=2",
        "default_hooks.checkpoint.interval=2",
        "default_hooks.logger.interval=1",
        "param_scheduler.0.end=1",
        "param_scheduler.1.begin=1",
        "param_scheduler.1.end=100",
        "env_cfg.cudnn_benchmark=False",
        "randomness.seed=0",
    ]
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
        options += [f"{loader}.num_workers=0", f"{loader}.persistent_workers=False",
                    f"{loader}.dataset.data_root={data_root}"]
    return options


def make_ade_tree(root: Path) -> Path:
    """Writes a tiny dataset in ADE20K's layout under ``root`` and returns it: 4 training and 2 validation images (64-96 px, non-square),
    labels 0 (ignored after reduce_zero_label) and 1..5 in blocks."""
    import cv2

    rng = np.random.default_rng(0)
    for split, count in (("training", 4), ("validation", 2)):
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for i in range(count):
            height, width = (64, 96) if i % 2 else (80, 64)
            label = np.zeros((height, width), np.uint8)
            label[: height // 2] = 1 + i % 3
            label[height // 2:, : width // 2] = 5
            image = (label[..., None] * 40 + rng.integers(0, 30, (height, width, 3))).astype(np.uint8)
            cv2.imwrite(str(root / "images" / split / f"im{i}.jpg"), image)
            cv2.imwrite(str(root / "annotations" / split / f"im{i}.png"), label)
    return root
