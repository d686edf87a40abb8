"""mmdetection integration: ``import vmamba2d.det`` (or ``custom_imports=dict(imports=['vmamba2d.det'])``
in an mmdet config) makes mmdet importable with mmcv-lite (the ``mmcv.ops`` stand-in of
:mod:`vmamba2d.openmmlab.mmcv_standin.install`: nms, batched_nms, RoIAlign ... on torchvision), lets torch's
``weights_only`` loading read mmengine checkpoints (and makes mmengine load local checkpoint files
that way on every torch), registers the crash-safe ``AtomicCheckpointHook``
(:mod:`vmamba2d.openmmlab.safe_checkpoints`; det/train.py uses it, with
:mod:`vmamba2d.openmmlab.work_dir` for start / resume / repair), gives mmengine's FLOP counter the
scan's FLOP handle and registers :class:`VMamba2DBackbone` in mmdet's MODELS registry - the same
class :mod:`vmamba2d.seg` registers in mmseg's. mmsegmentation need not be installed. mmdet's own
tools import ``mmdet.models`` before a config's ``custom_imports`` run: start them through
:mod:`vmamba2d.det.mmdet_tools`.
"""
from vmamba2d.openmmlab.integration import prepare_openmmlab, require_packages

require_packages("vmamba2d.det", ("mmengine", "mmcv", "mmdet", "pycocotools"), "det",
                 "mmdetection 3.3.0, mmengine, mmcv-lite 2.1.0, pycocotools")
prepare_openmmlab()

from mmdet.registry import MODELS  # noqa: E402

from vmamba2d.openmmlab.backbone import VMamba2DBackbone  # noqa: E402
from vmamba2d.openmmlab.mmcv_standin.install import compat_layer_active  # noqa: E402
from vmamba2d.openmmlab.safe_checkpoints import AtomicCheckpointHook  # noqa: E402

MODELS.register_module(module=VMamba2DBackbone, force=True)  # force: the same class again on a reload

__all__ = ["AtomicCheckpointHook", "VMamba2DBackbone", "compat_layer_active"]
