"""Export of the models to other runtimes: ONNX (needs the ``onnx`` extra).

    export_onnx(model, "model.onnx", (224, 224))          # one self-contained, checked file
    torch.onnx.export(model, (x,), dynamo=True, custom_translation_table=translation_table())
"""
from .onnx_export import (
    MissingOnnxExtraError,
    export_onnx,
    max_relative_error,
    missing_onnx_packages,
    onnx_session,
    require_onnx_extra,
)


def translation_table() -> dict:
    """The scan custom ops mapped to their ONNX translations, for ``torch.onnx.export``'s
    ``custom_translation_table`` (see :mod:`vmamba2d.export.onnx_scan`)."""
    require_onnx_extra()
    from .onnx_scan import translation_table as table

    return table()


__all__ = [
    "MissingOnnxExtraError",
    "export_onnx",
    "max_relative_error",
    "missing_onnx_packages",
    "onnx_session",
    "require_onnx_extra",
    "translation_table",
]
