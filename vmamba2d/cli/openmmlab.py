"""``vmamba2d-{seg,det}-{train,test,flops}``: the commands of :mod:`vmamba2d.seg.commands` and
:mod:`vmamba2d.det.commands`, which also take the name of a config this package ships in place of
its path, ``--list`` to print those names and ``--version`` to print the versions in use (and
whether mmcv's compiled ops or the PyTorch stand-in run ``mmcv.ops``)."""
from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

from vmamba2d.cli.configs import config_listing, resolve_config
from vmamba2d.extras import MissingExtraError

LIST_OPTION = "--list"
VERSION_OPTION = "--version"
TOOLKITS = {"seg": "mmseg", "det": "mmdet"}


def version_report(kind: str) -> str:
    """One line: vmamba2d, torch, mmengine, the toolkit and mmcv versions, and what runs mmcv.ops."""
    import importlib.metadata as metadata

    import vmamba2d
    from vmamba2d.openmmlab.mmcv_standin.install import compat_layer_active

    packages = {"torch": "torch", "mmengine": "mmengine", TOOLKITS[kind]: "mmsegmentation" if kind == "seg" else "mmdet"}
    versions = [f"vmamba2d {vmamba2d.__version__}"]
    versions += [f"{name} {metadata.version(dist)}" for name, dist in packages.items()]
    mmcv = "mmcv-lite" if compat_layer_active() else "mmcv"
    ops = "PyTorch stand-in (mmcv-lite has no compiled ops)" if compat_layer_active() else "compiled"
    return f"{', '.join(versions)}, {mmcv} {metadata.version(mmcv)}; mmcv.ops: {ops}"


def _run(kind: str, command: str, argv: Optional[Sequence[str]]) -> int:
    """Run ``vmamba2d.<kind>.commands.<command>.main`` with shipped config names resolved to paths.

    Returns the exit code: 0, the command's own, or 2 with one line on stderr when the toolkit's
    extra is not installed.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if LIST_OPTION in args:
        print(config_listing(kind))
        return 0
    try:
        commands = importlib.import_module(f"vmamba2d.{kind}.commands")
    except MissingExtraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if VERSION_OPTION in args:
        print(version_report(kind))
        return 0
    args = [arg if arg.startswith("-") else resolve_config(kind, arg) for arg in args]
    code = getattr(commands, command).main(args)
    return code if isinstance(code, int) else 0  # the flops command returns its counts


def seg_train(argv: Optional[Sequence[str]] = None) -> int:
    return _run("seg", "TRAIN", argv)


def seg_test(argv: Optional[Sequence[str]] = None) -> int:
    return _run("seg", "TEST", argv)


def seg_flops(argv: Optional[Sequence[str]] = None) -> int:
    return _run("seg", "FLOPS", argv)


def det_train(argv: Optional[Sequence[str]] = None) -> int:
    return _run("det", "TRAIN", argv)


def det_test(argv: Optional[Sequence[str]] = None) -> int:
    return _run("det", "TEST", argv)


def det_flops(argv: Optional[Sequence[str]] = None) -> int:
    return _run("det", "FLOPS", argv)
