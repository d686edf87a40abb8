"""ImageNet-style classification training and evaluation for vmamba2d (and any timm model).

Entry points: ``classification/train.py`` and ``classification/eval.py`` (also runnable as
``python -m classification.train`` / ``python -m classification.eval``).
"""
