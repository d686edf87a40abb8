"""mmsegmentation integration: ``import vmamba2d.seg`` (or ``custom_imports=dict(imports=['vmamba2d.seg'])``
in an mmseg config) makes mmseg importable with mmcv-lite, lets torch's ``weights_only`` loading read
mmengine checkpoints (and makes mmengine load local checkpoint files that way on every torch),
registers the crash-safe ``AtomicCheckpointHook`` (:mod:`vmamba2d.openmmlab.safe_checkpoints`;
seg/train.py uses it, with :mod:`vmamba2d.openmmlab.work_dir` for start / resume / repair), gives
mmengine's FLOP counter the scan's FLOP handle and registers :class:`VMamba2DBackbone` in mmseg's
MODELS registry. The toolkit-neutral code lives in :mod:`vmamba2d.openmmlab` (shared with
:mod:`vmamba2d.det`); this package holds only what is mmseg's. mmseg's own tools import
``mmseg.models`` before a config's ``custom_imports`` run: start them through
:mod:`vmamba2d.seg.mmseg_tools`.
"""
from vmamba2d.openmmlab.integration import prepare_openmmlab, require_packages

require_packages("vmamba2d.seg", ("mmengine", "mmcv", "mmseg"), "seg",
                 "mmsegmentation 1.2.2, mmengine, mmcv-lite 2.1.0")
prepare_openmmlab()

from mmseg.registry import MODELS  # noqa: E402

from vmamba2d.openmmlab.backbone import VMamba2DBackbone  # noqa: E402
from vmamba2d.openmmlab.mmcv_standin.install import compat_layer_active  # noqa: E402
from vmamba2d.openmmlab.safe_checkpoints import AtomicCheckpointHook  # noqa: E402

MODELS.register_module(module=VMamba2DBackbone, force=True)  # force: the same class again on a reload

__all__ = ["AtomicCheckpointHook", "VMamba2DBackbone", "compat_layer_active"]
