# A first run in minutes on a CPU: Mask R-CNN + 2DVMamba-Tiny (the full model) on the COCO-layout
# folder that `vmamba2d-tiny-data` writes to data/tiny/coco (8 training, 4 validation images with
# COCO's 80 categories): images resized to 128 x 96, batch 2, 2 epochs, box and mask AP after each,
# no worker processes.
#   vmamba2d-tiny-data && vmamba2d-det-train tiny-data_mask-rcnn_vmamba2d-tiny_fpn --from-scratch
_base_ = ['./mask-rcnn_vmamba2d-tiny_fpn_1x_coco.py']
data_root = 'data/tiny/coco/'
# score_thr 0: a model this briefly trained scores below mmdet's 0.05, and the COCO metric needs detections
model = dict(test_cfg=dict(rcnn=dict(score_thr=0.0, max_per_img=20)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 96), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 96), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
max_epochs = 2
train_cfg = dict(max_epochs=max_epochs, val_interval=1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[max_epochs], gamma=0.1),
]
default_hooks = dict(logger=dict(interval=2))
