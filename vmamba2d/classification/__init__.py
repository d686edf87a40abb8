"""ImageNet-style classification training and evaluation for vmamba2d (and any timm model).

The command-line entry points are ``classification/train.py`` and ``classification/eval.py`` at
the repository root (``python -m classification.train`` works too); they call :func:`train.main`
and :func:`eval.main` of this package. Recipe and resume rules: docs/training.md.
"""
