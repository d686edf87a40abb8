# A first run in minutes on a CPU: UperNet + 2DVMamba-Tiny (the full model) on the ADE20K-layout
# folder that `vmamba2d-tiny-data` writes to data/tiny/ade (8 training, 4 validation images):
# 64x64 crops, batch 2, 10 iterations, validation and a checkpoint at the end, no worker processes.
#   vmamba2d-tiny-data && vmamba2d-seg-train tiny-data_upernet_vmamba2d_tiny --from-scratch
_base_ = ['./upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py']
data_root = 'data/tiny/ade'
crop_size = (64, 64)
model = dict(data_preprocessor=dict(size=crop_size))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='Resize', scale=(128, 64), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 64), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=5, end=10),
]
train_cfg = dict(max_iters=10, val_interval=10)
default_hooks = dict(logger=dict(interval=5), checkpoint=dict(interval=10))
