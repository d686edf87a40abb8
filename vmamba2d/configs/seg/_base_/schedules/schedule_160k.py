# AdamW 6e-5, weight decay 0.01 (none on norms and on SS2D's A_logs / Ds), 1500-iteration linear
# warm-up then poly (power 1.0) decay, 160k iterations at total batch 16.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        custom_keys={
            '.A_logs': dict(decay_mult=0.0),
            '.Ds': dict(decay_mult=0.0),
        }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=1500, end=160000),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=160000, val_interval=16000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
# the learning rate above is for total batch 16 (seg/train.py --auto-scale-lr rescales it)
auto_scale_lr = dict(enable=False, base_batch_size=16)
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=16000, max_keep_ckpts=3,
                    save_best='mIoU', rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
