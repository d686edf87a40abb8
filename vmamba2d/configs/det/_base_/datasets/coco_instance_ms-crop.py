# COCO 2017 instance segmentation with the multi-scale + crop training of VMamba's (and Swin's) 3x
# schedule (the DETR augmentation): a random flip, then either a resize of the short side to one of
# 480, 512, ..., 800 (long side <= 1333), or a resize to 400 / 500 / 600, a random crop of 384-600
# pixels and then the 480-800 resize. Test: single-scale 1333x800 as in coco_instance.py.
_base_ = ['./coco_instance.py']
backend_args = None
multi_scales = [(1333, short) for short in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=multi_scales, keep_ratio=True)],
            [
                dict(type='RandomChoiceResize', scales=[(1333, 400), (1333, 500), (1333, 600)], keep_ratio=True),
                dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600), allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=multi_scales, keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
