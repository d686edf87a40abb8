# Mask R-CNN + FPN + 2DVMamba-Tiny on COCO 2017, 8 GPUs x 2 images:
# 3x schedule (36 epochs, multi-scale 480-800 + crop).
# ImageNet-1K weights of the backbone (ours or official VMamba v2) are read from pretrained/ below;
# elsewhere: --cfg-options model.backbone.init_cfg.checkpoint=path/to/weights.pth. Without the file
# det/train.py stops before building anything; `det/train.py CONFIG --from-scratch` (or
# --cfg-options model.backbone.init_cfg=None) trains the backbone from random weights.
_base_ = [
    '_base_/models/mask-rcnn_vmamba2d_fpn.py',
    '_base_/datasets/coco_instance_ms-crop.py',
    '_base_/schedules/schedule_3x.py',
    '_base_/default_runtime.py',
]
model = dict(
    backbone=dict(
        model_name='vmamba2d_tiny',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/vmamba2d_tiny_in1k.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
