"""Patch encoders for feature extraction: any timm model by name, or a ResNet truncated after its
third stage with average pooling (CLAM's ResNet50-trunc: ``resnet50_trunc``, 1024-d), with weights
from a local file only (nothing is downloaded).

    encoder = build_encoder("vit_large_patch16_224", weights="uni.safetensors")   # UNI's architecture
    encoder = build_encoder("resnet50_trunc", weights="resnet50.pth")
    encoder.module(images)   # (B, 3, S, S) normalised -> (B, encoder.dim)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
import torch.nn as nn

TRUNC_SUFFIX = "_trunc"


class TruncatedResNet(nn.Module):
    """A timm ResNet's stem and stages 1-3, then global average pooling: (B, 3, S, S) -> (B, C3)."""

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__()
        self.resnet = resnet

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        net = self.resnet
        x = net.maxpool(net.act1(net.bn1(net.conv1(images))))
        x = net.layer3(net.layer2(net.layer1(x)))
        return x.mean(dim=(2, 3))


@dataclass
class Encoder:
    """module (eval mode) maps (B, 3, input_size, input_size) images normalised with mean / std to
    (B, dim) features; name, weights (path or None), weights_sha256."""

    module: nn.Module
    name: str
    dim: int
    input_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    weights: Optional[str]
    weights_sha256: Optional[str]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a safetensors file or a weights-only torch file (a plain state dict or one
    under ``"state_dict"`` / ``"model"``)."""
    if not path.is_file():
        raise FileNotFoundError(f"--weights {path} not found")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    content: Any = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(content, dict) and isinstance(content.get(key), dict):
            content = content[key]
    if not isinstance(content, dict) or not all(isinstance(v, torch.Tensor) for v in content.values()):
        raise ValueError(f"--weights {path} holds no state dict (a dict of tensors)")
    return content


def _create(name: str) -> tuple[nn.Module, nn.Module, set[str]]:
    """(model to load weights into, module to run, key prefixes the run module does not use)."""
    import timm

    if name.endswith(TRUNC_SUFFIX):
        base = name[: -len(TRUNC_SUFFIX)]
        if not base.startswith("resnet"):
            raise ValueError(f"--encoder {name}: the _trunc preset needs a timm ResNet name (resnet50_trunc), "
                             f"got {base!r}")
        model = timm.create_model(base, pretrained=False, num_classes=0)
        return model, TruncatedResNet(model), {"layer4.", "fc."}
    try:
        model = timm.create_model(name, pretrained=False, num_classes=0)
    except RuntimeError as error:  # timm: "Unknown model (...)"
        raise ValueError(f"--encoder {name!r} is not a timm model name: {error}") from error
    return model, model, set()


def build_encoder(name: str, *, weights: Optional[Union[str, Path]] = None, random_init: bool = False,
                  seed: int = 0, input_size: Optional[int] = None) -> Encoder:
    """An encoder by timm name (or ``<resnet>_trunc``) with weights from ``weights``, or a random
    init seeded with ``seed`` when ``random_init``; exactly one of the two must be given.

    Weights must fit the model: missing or mis-shaped keys raise a ValueError listing them; keys the
    model does not have are an error too, except a truncated ResNet's stage 4 and classifier.
    ``input_size`` defaults to the model's pretrained config (224 for most).
    """
    if (weights is None) == (not random_init):
        raise ValueError("pass --weights FILE (the encoder's pretrained weights) or --random-init: nothing is "
                         "downloaded")
    with torch.random.fork_rng(devices=[]):  # the caller's generator state is left as it was
        torch.manual_seed(seed)
        loaded, module, unused = _create(name)
    sha = None
    if weights is not None:
        path = Path(weights)
        state = load_state_dict_file(path)
        try:
            result = loaded.load_state_dict(state, strict=False)
        except RuntimeError as error:  # mis-shaped tensors
            raise ValueError(f"--weights {path} does not fit --encoder {name}: {str(error).strip()}") from error
        unexpected = [k for k in result.unexpected_keys if not any(k.startswith(p) for p in unused)]
        missing = [k for k in result.missing_keys if not any(k.startswith(p) for p in unused)]
        if missing or unexpected:
            parts = [f"missing keys ({len(missing)}): {', '.join(missing[:8])}" if missing else "",
                     f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:8])}" if unexpected else ""]
            raise ValueError(f"--weights {path} does not fit --encoder {name}: " + "; ".join(p for p in parts if p))
        sha = file_sha256(path)
    module.eval()
    config = getattr(loaded, "pretrained_cfg", {}) or {}
    size = int(input_size or config.get("input_size", (3, 224, 224))[-1])
    mean = tuple(float(v) for v in config.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(float(v) for v in config.get("std", (0.229, 0.224, 0.225)))
    with torch.no_grad():
        dim = int(module(torch.zeros(1, 3, size, size)).shape[-1])
    return Encoder(module, name, dim, size, mean, std, None if weights is None else str(weights), sha)
