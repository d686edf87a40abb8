# VMamba's 3x detection schedule: 36 epochs, lr x0.1 after epochs 27 and 33; otherwise the 1x
# schedule (AdamW lr 1e-4, weight decay 0.05, 1000-iteration warm-up).
_base_ = ['./schedule_1x.py']
max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
