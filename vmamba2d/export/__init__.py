"""Export of the models to other runtimes: ONNX (needs the ``onnx`` extra).

    export_onnx(model, "model.onnx", (224, 224))          # one self-contained, checked file
    torch.onnx.export(model, (x,), dynamo=True)           # after import vmamba2d.export
    torch.onnx.export(model, (x,), dynamo=True, custom_translation_table=translation_table())
    export_mil_onnx(mil_model, "slide.onnx")             # a 2DMambaMIL model: features, coords
"""
from .onnx_export import (
    MissingOnnxExtraError,
    export_onnx,
    max_relative_error,
    missing_onnx_packages,
    onnx_session,
    require_onnx_extra,
)
from .mil_onnx import export_mil_onnx, mil_max_relative_error
from .onnx_registry import (
    TESTED_TORCH_SERIES,
    UntestedTorchError,
    register_if_onnx_installed,
    register_onnx_translations,
)

# With the onnx extra installed, the bare torch.onnx.export(model, x, dynamo=True) finds the scan
# ops' translations once this package is imported (onnx and onnxscript get imported: ~0.2 s).
register_if_onnx_installed()


def translation_table() -> dict:
    """The scan custom ops mapped to their ONNX translations, for ``torch.onnx.export``'s
    ``custom_translation_table`` (see :mod:`vmamba2d.export.onnx_scan`)."""
    require_onnx_extra()
    from .onnx_scan import translation_table as table

    return table()


__all__ = [
    "MissingOnnxExtraError",
    "export_mil_onnx",
    "export_onnx",
    "max_relative_error",
    "mil_max_relative_error",
    "missing_onnx_packages",
    "onnx_session",
    "register_onnx_translations",
    "require_onnx_extra",
    "TESTED_TORCH_SERIES",
    "translation_table",
    "UntestedTorchError",
]
