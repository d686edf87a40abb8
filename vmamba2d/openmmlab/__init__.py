"""Pieces shared by the OpenMMLab integrations (:mod:`vmamba2d.seg`, :mod:`vmamba2d.det`).

Nothing here imports mmsegmentation or mmdetection: each toolkit package registers what it needs
in its own registries.
"""
