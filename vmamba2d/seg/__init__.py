"""mmsegmentation integration: ``import vmamba2d.seg`` (or ``custom_imports=dict(imports=['vmamba2d.seg'])``
in an mmseg config) makes mmseg importable with mmcv-lite, lets torch's ``weights_only`` loading read
mmengine checkpoints (and makes mmengine load local checkpoint files that way on every torch),
registers the crash-safe ``AtomicCheckpointHook`` (:mod:`.safe_checkpoints`; seg/train.py uses it,
with :mod:`.work_dir` for start / resume / repair), gives mmengine's FLOP counter the scan's FLOP
handle and registers :class:`VMamba2DBackbone` in mmseg's MODELS registry. mmseg's own tools import
``mmseg.models`` before a config's ``custom_imports`` run: start them through
:mod:`vmamba2d.seg.mmseg_tools`.
"""
import importlib.util

_MISSING = [name for name in ("mmengine", "mmcv", "mmseg") if importlib.util.find_spec(name) is None]
if _MISSING:
    raise ImportError(f"vmamba2d.seg needs {', '.join(_MISSING)}: install the seg extra, "
                      "`pip install -e .[seg]` (mmsegmentation 1.2.2, mmengine, mmcv-lite 2.1.0)")

from vmamba2d.openmmlab.mmcv_compat import compat_layer_active, install_mmcv_ops_compat  # noqa: E402

install_mmcv_ops_compat()  # before anything imports mmseg.models / mmseg.utils

from .checkpoint_safety import allow_mmengine_checkpoint_globals, use_weights_only_local_loader  # noqa: E402

allow_mmengine_checkpoint_globals()
use_weights_only_local_loader()

from .safe_checkpoints import AtomicCheckpointHook, register_atomic_backend  # noqa: E402

register_atomic_backend()

from .complexity import register_mmengine_flop_handles  # noqa: E402

register_mmengine_flop_handles()

from .backbone import VMamba2DBackbone  # noqa: E402

__all__ = ["AtomicCheckpointHook", "VMamba2DBackbone", "allow_mmengine_checkpoint_globals", "compat_layer_active",
           "install_mmcv_ops_compat", "register_mmengine_flop_handles", "use_weights_only_local_loader"]
