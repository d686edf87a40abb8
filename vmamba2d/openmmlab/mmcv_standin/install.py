"""Installs the stand-in for ``mmcv.ops`` when mmcv's compiled extension is missing (mmcv-lite).

mmsegmentation 1.2.2 and mmdetection 3.3.0 import names from ``mmcv.ops`` and its submodules at
module level (``point_sample``, ``sigmoid_focal_loss``, ``batched_nms`` from ``mmcv.ops.nms``,
``roi_align`` from ``mmcv.ops.roi_align``, the merge cells, ``CARAFEPack``, deformable
convolutions, ...), and mmdetection's RoI extractors look their layer up with
``getattr(mmcv.ops, 'RoIAlign')``. With ``mmcv-lite`` every one of those imports fails, because
its ``mmcv.ops`` package needs the compiled ``mmcv._ext``. The stand-in is a package-like module
tree (``mmcv.ops`` plus the submodules that the two toolkits import) with:

* PyTorch implementations, same semantics as mmcv's, of the ops UperNet / FCN (none) and Faster /
  Mask R-CNN (FPN, RPN, RoIAlign heads, mask targets) run: ``nms`` and ``batched_nms``
  (:mod:`.nms`, on ``torchvision.ops.nms``), ``roi_align`` / ``RoIAlign`` (:mod:`.roi_align`, on
  ``torchvision.ops.roi_align``; ``pool_mode='avg'`` only); ``get_compiler_version`` /
  ``get_compiling_cuda_version`` report "n/a" (so ``mmcv.utils.collect_env`` works);
* placeholders for every other name the toolkits import (:mod:`.unavailable`: soft_nms,
  nms_match, RoIPool, point_sample, sigmoid_focal_loss, the merge cells, CornerPool, deformable
  convolution, CARAFE, ...) that import fine and raise "mmcv.ops.X is not available without full
  mmcv (pip install mmcv ...)" when built or called;
* every other name raises ``AttributeError`` (so ``from mmcv.ops import X`` fails clearly), and
  every other submodule is missing (``ModuleNotFoundError``).

The stand-in is installed only when ``mmcv._ext`` cannot be found; with a full mmcv build nothing
is changed.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import sys
import types
from typing import Any, Callable

from .nms import batched_nms, nms
from .roi_align import RoIAlign, roi_align
from .unavailable import INSTALL_HINT, PACKAGE, UNAVAILABLE_OPS, unavailable_op

LOGGER = logging.getLogger(__name__)
_MARKER = "__vmamba2d_compat__"


def get_compiler_version() -> str:
    """What ``mmcv.ops.get_compiler_version`` reports under the stand-in (no compiled ops)."""
    return "n/a (mmcv._ext not installed; vmamba2d's mmcv.ops stand-in)"


def get_compiling_cuda_version() -> str:
    """What ``mmcv.ops.get_compiling_cuda_version`` reports under the stand-in."""
    return "n/a (mmcv._ext not installed; vmamba2d's mmcv.ops stand-in)"


def _implemented_ops() -> dict[str, dict[str, Any]]:
    """The PyTorch ops, by the mmcv.ops submodule that defines them in mmcv."""
    return {
        # mmcv.utils.collect_env reads these
        "info": {"get_compiler_version": get_compiler_version,
                 "get_compiling_cuda_version": get_compiling_cuda_version},
        "nms": {"batched_nms": batched_nms, "nms": nms},
        "roi_align": {"RoIAlign": RoIAlign, "roi_align": roi_align},
    }


def _missing_name(module: str, provided: list[str]) -> Callable[[str], Any]:
    def __getattr__(name: str):
        raise AttributeError(
            f"module {module!r} has no attribute {name!r}: mmcv's compiled extension (mmcv._ext) "
            f"is not installed and vmamba2d's mmcv-lite compatibility layer provides only "
            f"{', '.join(provided)}; to use it: {INSTALL_HINT}.")

    return __getattr__


def _new_module(name: str, contents: dict[str, Any], is_package: bool) -> types.ModuleType:
    doc = __doc__ if is_package else f"vmamba2d's stand-in for {name} (see {__name__})."
    module = types.ModuleType(name, doc)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=is_package)
    if is_package:
        module.__path__ = []  # a package whose only submodules are those put in sys.modules
    setattr(module, _MARKER, True)
    for attribute, value in contents.items():
        setattr(module, attribute, value)
    module.__all__ = sorted(contents)
    module.__getattr__ = _missing_name(name, module.__all__)
    return module


def _build_modules() -> dict[str, types.ModuleType]:
    """The stand-in modules, by full name (``mmcv.ops`` and ``mmcv.ops.<submodule>``)."""
    submodules = _implemented_ops()
    for submodule, names in UNAVAILABLE_OPS.items():
        submodules.setdefault(submodule, {}).update({name: unavailable_op(name) for name in names})
    modules = {f"{PACKAGE}.{submodule}": _new_module(f"{PACKAGE}.{submodule}", contents, False)
               for submodule, contents in sorted(submodules.items())}
    everything = {name: value for contents in submodules.values()
                  for name, value in contents.items()}
    package = _new_module(PACKAGE, everything, True)
    for full_name, module in modules.items():
        # as in mmcv, an op named like its submodule (nms, roi_align, ...) shadows the submodule
        if not hasattr(package, full_name.rsplit(".", 1)[1]):
            setattr(package, full_name.rsplit(".", 1)[1], module)
    return {PACKAGE: package, **modules}


def compiled_mmcv_ops_available() -> bool:
    """True when mmcv's compiled extension ``mmcv._ext`` can be found (a full mmcv install)."""
    try:
        return importlib.util.find_spec("mmcv._ext") is not None
    except ModuleNotFoundError:  # mmcv itself is not installed
        return False


def compat_layer_active() -> bool:
    """True when the stand-in ``mmcv.ops`` module of this file is the one in use."""
    return getattr(sys.modules.get(PACKAGE), _MARKER, False)


def install_mmcv_ops_compat() -> bool:
    """Install the stand-in ``mmcv.ops`` if (and only if) compiled mmcv ops are missing.

    Returns:
        True when the stand-in is (now or already) in use, False when real mmcv ops are used.
    """
    if compat_layer_active():
        return True
    if compiled_mmcv_ops_available():
        return False
    import mmcv  # mmcv-lite: the package exists, its compiled ops do not

    modules = _build_modules()
    sys.modules.update(modules)
    mmcv.ops = modules[PACKAGE]
    # Nothing for the user to act on (our models need no other op; the others raise when used), so
    # a debug note, not a warning; compat_layer_active() reports it
    LOGGER.debug(
        "mmcv's compiled ops (mmcv._ext) are not installed; using a PyTorch stand-in for "
        "mmcv.ops (nms, batched_nms, roi_align, RoIAlign). UperNet/FCN and Faster/Mask R-CNN need "
        "nothing else; the other ops mmseg / mmdet import raise NotImplementedError when used.")
    return True
