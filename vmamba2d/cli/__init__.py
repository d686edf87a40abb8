"""The installed commands (``[project.scripts]`` of pyproject.toml); each prints its usage and
examples for ``--help``.

==========================  ==================================================================
command                     what it runs
==========================  ==================================================================
``vmamba2d-train``          ImageNet-layout training (:mod:`vmamba2d.classification.train`)
``vmamba2d-eval``           top-1 / top-5 of a checkpoint (:mod:`vmamba2d.classification.eval`)
``vmamba2d-seg-train``      mmseg training; a config path or a shipped config's name (``--list``)
``vmamba2d-seg-test``       mIoU of a segmentor checkpoint
``vmamba2d-seg-flops``      parameters and FLOPs of a segmentor
``vmamba2d-det-train``      mmdet training (Mask R-CNN), path or shipped name (``--list``)
``vmamba2d-det-test``       box / mask AP of a detector checkpoint
``vmamba2d-det-flops``      parameters and FLOPs of a detector
``vmamba2d-weights``        the backbone file seg / det configs expect, from a local checkpoint
``vmamba2d-mil-train``      2DMambaMIL (or a baseline) on per-slide features
``vmamba2d-mil-eval``       a MIL checkpoint on a split
``vmamba2d-mil-extract``    patch features of whole-slide images (:mod:`vmamba2d.mil.extract`)
``vmamba2d-mil-predict``    a trained MIL model on new slides (:mod:`vmamba2d.mil.predict`)
``vmamba2d-mil-heatmap``    a MIL model's attention over one slide, with a colour bar
``vmamba2d-export-onnx``    a model to a standard ONNX file (:mod:`vmamba2d.cli.export_onnx`)
``vmamba2d-erf``            effective receptive fields (:mod:`vmamba2d.cli.erf`)
``vmamba2d-flops``          parameters and FLOPs of timm models (:mod:`vmamba2d.cli.flops`)
``vmamba2d-demo``           the op, the model and the ERF figure in a few seconds on a CPU
``vmamba2d-tiny-data``      small datasets in every layout the quick starts use
==========================  ==================================================================
"""
