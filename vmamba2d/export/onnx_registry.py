"""Make the bare ``torch.onnx.export(model, x, dynamo=True)`` find the scan ops' ONNX translations.

torch has no public API for adding a translation to the exporter's default table, only the
per-call ``custom_translation_table``. Its default table is rebuilt at every export
(``ONNXRegistry.from_torchlib``) from torch's own functions plus onnxscript's torchlib registry,
which torch reads through onnxscript's framework API (``onnxscript._framework_apis``). So the
package adds its translations to that registry with onnxscript's ``torch_op`` decorator. That
torch reads it is an internal detail of torch, checked for the torch series in
``TESTED_TORCH_SERIES`` (tests/export/test_onnx_export.py runs the bare call); on other versions
:func:`register_onnx_translations` raises and ``import vmamba2d.export`` warns instead of registering.
"""
from __future__ import annotations

import importlib.util
import warnings

import torch

from .onnx_export import MissingOnnxExtraError

# torch (major, minor) series whose exporter reads onnxscript's torchlib registry (tested).
TESTED_TORCH_SERIES = ((2, 14),)


class UntestedTorchError(RuntimeError):
    """This torch's exporter is not known to read onnxscript's torchlib registry."""


def _torch_series() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def register_onnx_translations() -> None:
    """Register the ONNX translation of every scan custom op (:mod:`vmamba2d.export.onnx_scan`)
    in the table ``torch.onnx.export(..., dynamo=True)`` uses by default. Idempotent.

    Raises MissingOnnxExtraError without the ``onnx`` extra, UntestedTorchError on a torch series
    not in ``TESTED_TORCH_SERIES`` (then pass
    ``custom_translation_table=vmamba2d.export.translation_table()`` to ``torch.onnx.export``),
    and RuntimeError if another translation is already registered for one of the ops or onnxscript
    cannot read a translation's signature (then nothing more is registered).
    """
    if _torch_series() not in TESTED_TORCH_SERIES:
        tested = ", ".join(f"{major}.{minor}" for major, minor in TESTED_TORCH_SERIES)
        raise UntestedTorchError(
            f"vmamba2d registers its scan ops' ONNX translations in onnxscript's torchlib registry, "
            f"which torch.onnx.export reads by default in torch {tested}; this is torch {torch.__version__}. "
            "Pass custom_translation_table=vmamba2d.export.translation_table() to torch.onnx.export "
            "(vmamba2d.export.export_onnx does)"
        )
    try:
        from onnxscript.function_libs.torch_lib import registration
    except ImportError as error:  # onnxruntime is not needed to register, so not require_onnx_extra
        raise MissingOnnxExtraError(
            f'registering the ONNX translations needs onnxscript: {error}. Install the onnx extra: '
            'pip install "vmamba2d[onnx]"'
        ) from error

    from .onnx_scan import translation_table

    for op, translation in translation_table().items():
        name = op.name()  # "vmamba2d::<op>" for the default overload, as the registry names ops
        if name in registration.default_registry:
            registered = registration.default_registry[name].overloads
            if not any(getattr(f, "func", None) is translation for f in registered):
                raise RuntimeError(f"another ONNX translation is already registered for {name}: {registered}")
            continue
        # trace_only: torch's exporter runs the Python function at export, writing its nodes inline
        # (no onnxscript function, no custom domain in the file).
        traced = registration.torch_op(name, registry=registration.Registry(), trace_only=True)(translation)
        try:
            # onnxscript parses the function's source for its signature at every export, for all
            # registered ops at once: a failure there would break the export of any model.
            traced.function_ir
        except Exception as error:
            raise RuntimeError(f"onnxscript cannot read the signature of {translation.__name__}: {error}") from error
        registration.default_registry.register(traced, name)


def register_if_onnx_installed() -> None:
    """Called by ``import vmamba2d.export``: register the translations when onnxscript is installed;
    warn (once) instead of failing the import when that is not possible."""
    if importlib.util.find_spec("onnxscript") is None:
        return
    try:
        register_onnx_translations()
    except Exception as error:  # a broken optional install (onnx, protobuf, ...) must not break import vmamba2d.export
        warnings.warn(
            f"vmamba2d: the bare torch.onnx.export(model, x, dynamo=True) will not find the scan ops' "
            f"ONNX translations: {error}", RuntimeWarning, stacklevel=3,
        )
