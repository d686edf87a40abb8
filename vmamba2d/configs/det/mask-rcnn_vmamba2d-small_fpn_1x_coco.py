# Mask R-CNN + FPN + 2DVMamba-Small on COCO 2017, 8 GPUs x 2 images:
# 1x schedule (12 epochs, single-scale 1333x800).
# ImageNet-1K weights of the backbone (ours or official VMamba v2) are read from pretrained/ below;
# elsewhere: --cfg-options model.backbone.init_cfg.checkpoint=path/to/weights.pth. Without the file
# det/train.py stops before building anything; `det/train.py CONFIG --from-scratch` (or
# --cfg-options model.backbone.init_cfg=None) trains the backbone from random weights.
# Everything but the backbone comes from the 2DVMamba-Tiny config of the same schedule.
_base_ = './mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py'
model = dict(
    backbone=dict(
        model_name='vmamba2d_small',
        drop_path_rate=0.3,
        init_cfg=dict(checkpoint='pretrained/vmamba2d_small_in1k.pth')))
