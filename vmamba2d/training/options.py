"""Command-line pieces the training scripts share: KEY=VALUE option lists and AMP contexts."""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Sequence

import torch
import yaml

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}


def parse_key_values(items: Sequence[str], flag: str,
                     error: type[Exception] = ValueError) -> dict[str, Any]:
    """``["num_blocks=2", "depths=[1,1]"]`` -> ``{"num_blocks": 2, "depths": [1, 1]}``.

    Values are parsed as YAML. A malformed item raises ``error`` naming ``flag`` (the option the
    items came from, e.g. ``"--model-kwargs"``).
    """
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise error(f"{flag}: expected KEY=VALUE, got {item!r}")
        try:
            values[key] = yaml.safe_load(value)
        except yaml.YAMLError as yaml_error:
            raise error(f"{flag}: cannot parse the value of {key!r}: {yaml_error}") from yaml_error
    return values


def autocast(device: torch.device, amp: str) -> ContextManager:
    """Autocast context for ``amp`` in {'none', 'bf16', 'fp16'} on ``device``."""
    dtype = AMP_DTYPES[amp]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
