# VMamba's 1x detection schedule (from mmdetection's Swin Mask R-CNN): 12 epochs at total batch 16,
# AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05 (none on parameters whose name contains
# 'norm'), 1000-iteration linear warm-up from 0.001x, lr x0.1 after epochs 8 and 11.
max_epochs = 12
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.0)}))
# the learning rate above is for total batch 16 = 8 GPUs x 2 images (det/train.py --auto-scale-lr
# rescales it)
auto_scale_lr = dict(enable=False, base_batch_size=16)
