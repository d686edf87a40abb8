"""What ``import vmamba2d.seg`` and ``import vmamba2d.det`` both do before their toolkit is imported."""
from __future__ import annotations

from typing import Sequence

from vmamba2d.extras import require_extra


def require_packages(package: str, names: Sequence[str], extra: str, versions: str) -> None:
    """Raise :class:`~vmamba2d.extras.MissingExtraError` (an ImportError naming the pip extra) when
    any of the modules ``names`` is not installed.

    Args:
        package: the importing package, for the message (``"vmamba2d.det"``).
        names: top-level modules it needs (``("mmengine", "mmcv", "mmdet")``).
        extra: the extra that provides them (``pip install "vmamba2d[extra]"``).
        versions: what the extra pins, for the message.
    """
    require_extra(package, names, extra, versions)


def prepare_openmmlab() -> None:
    """Make mmengine / mmcv-lite ready for our models; call it before importing mmseg or mmdet.

    In order: installs the ``mmcv.ops`` stand-in when mmcv's compiled extension is missing
    (:mod:`.mmcv_standin.install`), lets ``torch.load(weights_only=True)`` read mmengine checkpoints and makes
    mmengine load local checkpoint files that way on every torch (:mod:`.checkpoint_safety`),
    registers the atomic local file backend and ``AtomicCheckpointHook`` in mmengine's HOOKS
    (:mod:`.safe_checkpoints`; toolkit registries inherit it) and gives mmengine's FLOP counter the
    scan's FLOP handles (:mod:`.complexity`). Each step may run again without harm.
    """
    from .mmcv_standin.install import install_mmcv_ops_compat

    install_mmcv_ops_compat()  # before anything imports mmseg.models / mmdet.models

    from .checkpoint_safety import allow_mmengine_checkpoint_globals, use_weights_only_local_loader
    from .complexity import register_mmengine_flop_handles
    from .safe_checkpoints import register_atomic_backend

    allow_mmengine_checkpoint_globals()
    use_weights_only_local_loader()
    register_atomic_backend()
    register_mmengine_flop_handles()
