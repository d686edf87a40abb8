"""ONNX export of the models (vmamba2d.export, tools/export_onnx.py): onnxruntime against eager
PyTorch (the compiled CPU kernels) on small configurations."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import timm
import torch

import vmamba2d.models  # noqa: F401  (registers the models with timm)
from vmamba2d.export.onnx_export import INPUT_NAME, export_onnx, max_relative_error, onnx_session

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(depths=(1, 1), dims=16)  # two stages: small graphs, quick exports
TOLERANCE = 1e-4


def create(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{**SMALL, **kwargs}).eval()


def images(batch: int, height: int, width: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"tool_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=["vmamba2d_tiny", "vmamba_tiny"])
def dynamic_export(request, tmp_path_factory):
    """(model, session) of a dynamic-size export: the 2D-scan family and the 1D (flat) one."""
    model = create(request.param)
    path = export_onnx(model, tmp_path_factory.mktemp("onnx") / f"{request.param}.onnx", (32, 48), dynamic_size=True)
    return model, onnx_session(path)


@pytest.mark.parametrize("batch, height, width", [(1, 64, 64), (3, 40, 72), (2, 33, 17)])
def test_dynamic_export_matches_eager_on_square_and_non_square_inputs(dynamic_export, batch, height, width):
    # one file: the batch size it was traced with (2) and others, any height / width
    model, session = dynamic_export
    assert max_relative_error(model, None, images(batch, height, width), session) <= TOLERANCE


def test_fixed_size_features_only_export_matches_and_rejects_other_sizes(tmp_path):
    model = create("vmamba2d_tiny", features_only=True, out_indices=(0, 1))
    path = export_onnx(model, tmp_path / "backbone.onnx", (48, 80))
    session = onnx_session(path)
    assert len(session.get_outputs()) == 2
    assert max_relative_error(model, None, images(2, 48, 80), session) <= TOLERANCE
    assert max_relative_error(model, None, images(5, 48, 80), session) <= TOLERANCE
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="dimensions"):
        session.run(None, {INPUT_NAME: images(1, 64, 80).numpy()})


def test_per_route_model_exports_the_single_route_op_at_a_fixed_size(tmp_path):
    # cross_scan="per_route" calls vmamba2d::selective_scan_2d_fwd (one call per grid shape)
    model = create("vmamba2d_tiny", cross_scan="per_route")
    with pytest.raises(ValueError, match="per_route"):
        export_onnx(model, tmp_path / "refused.onnx", (40, 56), dynamic_size=True)
    assert not (tmp_path / "refused.onnx").exists()
    session = onnx_session(export_onnx(model, tmp_path / "per_route.onnx", (40, 56)))
    assert max_relative_error(model, None, images(2, 40, 56), session) <= TOLERANCE


def test_cli_exports_a_checkpoint_and_checks_it(tmp_path, capsys):
    trained = create("vmamba_tiny")
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    checkpoint = tmp_path / "weights.pth"
    torch.save(trained.state_dict(), checkpoint)
    out = tmp_path / "model.onnx"
    code = load_tool("export_onnx").main([
        "vmamba_tiny", str(out), "--img-size", "32", "40", "--checkpoint", str(checkpoint),
        "--model-kwargs", "depths=[1,1]", "dims=16", "--check",
    ])
    printed = capsys.readouterr().out
    assert code == 0
    assert "onnx.checker passed" in printed and printed.count("max relative error") == 2
    session = onnx_session(out)
    x = images(2, 32, 40)
    assert max_relative_error(trained, None, x, session) <= TOLERANCE
    got = session.run(None, {INPUT_NAME: x.numpy()})[0]
    with torch.no_grad():
        untrained = create("vmamba_tiny")(x).numpy()
    assert np.abs(got - untrained).max() > 1e-2  # the checkpoint's weights, not a fresh init


def test_cli_refuses_clearly_without_the_onnx_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript -> ImportError
    code = load_tool("export_onnx").main(["vmamba2d_tiny", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert code == 2
    assert "missing: onnxscript" in err and 'pip install "vmamba2d[onnx]"' in err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("argv, message", [
    (["convnext_tiny", "m.onnx"], "vmamba2d_\\* / vmamba_\\* models"),
    (["vmamba2d_tiny", "m.onnx", "--checkpoint", "missing.pth"], "--checkpoint must be an existing file"),
    (["vmamba2d_tiny", "m.onnx", "--img-size", "0", "32"], "--img-size must be two positive ints"),
    (["vmamba2d_tiny", "m.onnx", "--model-kwargs", "depths"], "--model-kwargs: expected KEY=VALUE"),
])
def test_cli_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_tool("export_onnx").parse_args(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


class _GridBlock(torch.nn.Module):
    """A 2DMambaMIL block on a fixed 4 x 5 grid (the MIL models' scan: the single-route op)."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.block(tokens, 4, 5)


def test_mil_mamba_block_exports(tmp_path):
    from vmamba2d.export import translation_table
    from vmamba2d.mil.models import MambaBlock

    torch.manual_seed(0)
    model = _GridBlock(MambaBlock(16, d_state=4)).eval()
    tokens = torch.randn(20, 16, generator=torch.Generator().manual_seed(2))
    program = torch.onnx.export(model, (tokens,), dynamo=True, custom_translation_table=translation_table(),
                                verbose=False)
    program.save(str(tmp_path / "block.onnx"), external_data=False)
    session = onnx_session(tmp_path / "block.onnx")
    got = session.run(None, {session.get_inputs()[0].name: tokens.numpy()})[0]
    with torch.no_grad():
        want = model(tokens).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() <= TOLERANCE
