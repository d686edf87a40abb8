"""``vmamba2d-weights``: the backbone weights file a segmentation / detection config reads, made from
a local ImageNet-1K checkpoint. Fetches nothing.

No 2DVMamba ImageNet weights are published; VMamba v2's (github.com/MzeroMiko/VMamba, the ``vssm1``
tiny / small / base classification checkpoints) have the same parameters as the 2DVMamba model of
the same size and initialise it. Examples (after downloading one):

    vmamba2d-weights upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512            # where the file goes
    vmamba2d-weights upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512 --from vssm_tiny.pth
    vmamba2d-weights mask-rcnn_vmamba2d-tiny_fpn_1x_coco --from runs/in1k/best.pth

``--from`` takes an official VMamba v2 checkpoint or one of ours (vmamba2d-train's best.pth / last.pth,
EMA weights first). The weights are renamed to this package's layout, the classifier dropped, checked
against the config's backbone (every backbone weight present with its shape) and written atomically
to the path the config names (``model.backbone.init_cfg.checkpoint``, relative to the current
folder); an existing file is kept unless ``--overwrite``. The other way: train the backbone from
random weights with ``vmamba2d-seg-train CONFIG --from-scratch`` (or ``vmamba2d-det-train``).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from vmamba2d.cli.configs import resolve_config, shipped_configs
from vmamba2d.extras import MissingExtraError, require_extra


class WeightsError(ValueError):
    """Bad input of the command, reported in one line."""


def _resolve(config: str) -> str:
    """A config path, or the path of the shipped seg / det config named ``config``."""
    for kind in ("seg", "det"):
        path = resolve_config(kind, config)
        if path != config or os.path.isfile(path):
            return path
    names = sorted(shipped_configs("seg")) + sorted(shipped_configs("det"))
    raise WeightsError(f"config: no file {config!r} and no shipped config of that name (one of: {', '.join(names)})")


def backbone_target(config: str) -> tuple[str, str, dict]:
    """(checkpoint path the config reads, backbone model name, its model_kwargs) of a seg / det config."""
    require_extra("vmamba2d-weights", ("mmengine",), "seg", "or the det extra")
    from mmengine.config import Config

    from vmamba2d.openmmlab.runtime import backbone_checkpoint

    cfg = Config.fromfile(_resolve(config), format_python_code=False)
    backbone = cfg.model.get("backbone") or {}
    checkpoint = backbone_checkpoint(cfg)
    if checkpoint is None or "model_name" not in backbone:
        raise WeightsError(f"{config}: the config's backbone names no ImageNet checkpoint "
                           "(model.backbone.init_cfg.checkpoint) or no model_name")
    return checkpoint, backbone["model_name"], dict(backbone.get("model_kwargs") or {})


def convert(source: Path, model_name: str, model_kwargs: dict, trusted: bool = False) -> dict:
    """The backbone weights of checkpoint ``source`` in this package's names, checked against a
    ``model_name`` model: raises WeightsError naming what is missing or mis-shaped."""
    import timm

    import vmamba2d.models  # noqa: F401  (registers the timm models)
    from vmamba2d.openmmlab.pretrained import classification_weights, read_checkpoint

    weights = classification_weights(read_checkpoint(source, trusted=trusted))
    model = timm.create_model(model_name, pretrained=False, num_classes=0, **model_kwargs)
    expected = {k: v for k, v in model.state_dict().items() if not k.startswith(("head.", "norm."))}
    missing = sorted(set(expected) - set(weights))
    mis_shaped = sorted(k for k in set(expected) & set(weights) if weights[k].shape != expected[k].shape)
    if missing or mis_shaped:
        from vmamba2d.models.weights import listed_keys

        parts = [f"missing ({len(missing)}): {listed_keys(missing)}"] if missing else []
        parts += [f"other shapes ({len(mis_shaped)}): {listed_keys(mis_shaped)}"] if mis_shaped else []
        raise WeightsError(f"{source} does not fit {model_name}'s backbone: {'; '.join(parts)} "
                           "(a checkpoint of another size?)")
    return {k: weights[k] for k in expected}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vmamba2d-weights", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="seg / det config file, or the name of a shipped one "
                                       "(vmamba2d-seg-train --list, vmamba2d-det-train --list)")
    parser.add_argument("--from", dest="source", type=Path,
                        help="local ImageNet-1K checkpoint (VMamba v2's or ours); without it, print "
                             "where the config expects the file")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing weights file")
    parser.add_argument("--trusted", action="store_true",
                        help="load --from with weights_only=False (only for files you trust)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> Path:
    """Print where the weights go, and with ``--from`` write them there; returns the target path."""
    checkpoint, model_name, model_kwargs = backbone_target(args.config)
    target = Path(checkpoint).expanduser().absolute()
    if args.source is None:
        state = "exists" if target.is_file() else "missing"
        print(f"{args.config} initialises its {model_name} backbone from {target} ({state}).\n"
              f"Make it from a downloaded VMamba v2 (or our) ImageNet-1K checkpoint of the same size:\n"
              f"  vmamba2d-weights {args.config} --from DOWNLOADED.pth\n"
              f"or train the backbone from random weights: add --from-scratch to the train command.")
        return target
    if target.exists() and not args.overwrite:
        raise WeightsError(f"{target} exists; pass --overwrite to replace it")
    from vmamba2d.runs import atomic_torch_save

    weights = convert(args.source, model_name, model_kwargs, trusted=args.trusted)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(weights, target)
    print(f"wrote {target}: {len(weights)} {model_name} backbone tensors from {args.source}")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from vmamba2d.openmmlab.errors import InputError

    try:
        run(args)
    except (WeightsError, MissingExtraError, InputError, FileNotFoundError) as error:
        print(f"vmamba2d-weights: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
