# UperNet + 2DVMamba-Tiny on ADE20K, 512x512 crops, 160k iterations, 4 GPUs x 4 images.
# ImageNet-1K weights of the backbone (ours or official VMamba v2) are read from pretrained/ below;
# elsewhere: --cfg-options model.backbone.init_cfg.checkpoint=path/to/weights.pth. Without the file
# seg/train.py stops before building anything; `seg/train.py CONFIG --from-scratch` (or
# --cfg-options model.backbone.init_cfg=None) trains the backbone from random weights.
_base_ = [
    '_base_/models/upernet_vmamba2d.py',
    '_base_/datasets/ade20k.py',
    '_base_/default_runtime.py',
    '_base_/schedules/schedule_160k.py',
]
model = dict(
    backbone=dict(
        model_name='vmamba2d_tiny',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/vmamba2d_tiny_in1k.pth')))
