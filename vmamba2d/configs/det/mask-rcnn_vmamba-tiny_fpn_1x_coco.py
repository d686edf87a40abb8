# Mask R-CNN + FPN + VMamba (v2, 1D scan)-Tiny on COCO 2017, 8 GPUs x 2 images:
# 1x schedule (12 epochs, single-scale 1333x800).
# ImageNet-1K weights of the backbone (ours or official VMamba v2) are read from pretrained/ below;
# elsewhere: --cfg-options model.backbone.init_cfg.checkpoint=path/to/weights.pth. Without the file
# det/train.py stops before building anything; `det/train.py CONFIG --from-scratch` (or
# --cfg-options model.backbone.init_cfg=None) trains the backbone from random weights.
# Everything but the backbone comes from the 2DVMamba-Tiny config of the same schedule.
_base_ = './mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py'
model = dict(
    backbone=dict(
        model_name='vmamba_tiny',
        init_cfg=dict(checkpoint='pretrained/vmamba_tiny_in1k.pth')))
