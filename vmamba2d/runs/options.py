"""Command-line pieces the training scripts share: config files, KEY=VALUE option lists and AMP
contexts."""
from __future__ import annotations

import contextlib
from pathlib import Path
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


def resolve_config_path(config: str, config_dir: Path, error: type[Exception] = ValueError) -> Path:
    """``--config`` value -> a YAML path: the path itself, or a bare name looked up as
    ``<config_dir>/<name>.yaml``. Raises ``error`` listing the available names otherwise."""
    path = Path(config)
    if path.is_file():
        return path
    named = config_dir / f"{config}.yaml"
    if path.suffix == "" and named.is_file():
        return named
    available = sorted(p.stem for p in config_dir.glob("*.yaml"))
    raise error(f"--config: no such file {config!r} (and no config of that name in "
                f"{config_dir}; available: {', '.join(available) or 'none'})")


def load_flat_yaml(path: Path, field_names: Sequence[str],
                   error: type[Exception] = ValueError) -> dict[str, Any]:
    """Read a config YAML holding a flat mapping of ``field_names`` options (empty file -> {}).

    Raises ``error`` for invalid YAML, a non-mapping document or unknown keys (naming them and
    the known ones).
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as yaml_error:
        raise error(f"--config: {path} is not valid YAML: {yaml_error}") from yaml_error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"--config: {path} must hold a mapping of options, got {type(data).__name__}")
    unknown = sorted(set(data) - set(field_names))
    if unknown:
        raise error(f"--config: {path} has unknown option(s) {unknown}; known options: "
                    f"{', '.join(field_names)}")
    return data


def config_file_values(given: dict[str, Any], config_dir: Path, field_names: Sequence[str],
                       error: type[Exception] = ValueError) -> dict[str, Any]:
    """Pop ``config`` from the parsed flags ``given`` and return the options its YAML holds
    ({} without one): the middle layer of defaults < --config file < explicit flags."""
    config = given.pop("config", None)
    if not config:
        return {}
    return load_flat_yaml(resolve_config_path(config, config_dir, error), field_names, error)
