"""ONNX export of the models (vmamba2d.export, vmamba2d-export-onnx): onnxruntime against eager
PyTorch (the compiled CPU kernels) on small configurations."""
from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import timm
import torch

import vmamba2d.models  # noqa: F401  (registers the models with timm)
from vmamba2d.export import UntestedTorchError, register_onnx_translations
from vmamba2d.export.mil_onnx import export_mil_onnx, mil_max_relative_error, random_bag, run_mil_onnx
from vmamba2d.export.onnx_export import INPUT_NAME, export_onnx, max_relative_error, onnx_session
from vmamba2d.export.onnx_registry import register_if_onnx_installed
from vmamba2d.export.onnx_scan import selective_scan_2d_onnx
from vmamba2d.cli import export_onnx as export_onnx_cli
from vmamba2d.mil.models import MambaMIL2D


ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(depths=(1, 1), dims=16)  # two stages: small graphs, quick exports
TOLERANCE = 1e-4


def create(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **{**SMALL, **kwargs}).eval()


def images(batch: int, height: int, width: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


FAMILIES = ("vmamba2d_tiny", "vmamba_tiny")  # the 2D-scan family and the 1D (flat) one
BARE_EXPORT = """
import sys, timm, torch
import vmamba2d.export  # registers the scan ops' ONNX translations with torch's exporter

for name in sys.argv[2:]:
    torch.manual_seed(0)
    model = timm.create_model(name, depths=(1, 1), dims=16).eval()
    dims = {0: torch.export.Dim("batch"), 2: torch.export.Dim("height"), 3: torch.export.Dim("width")}
    torch.onnx.export(model, torch.randn(2, 3, 32, 48), f"{sys.argv[1]}/{name}.onnx", dynamo=True,
                      dynamic_shapes=(dims,))
"""


@pytest.fixture(scope="module")
def bare_exports(tmp_path_factory) -> Path:
    """The documented contract in a fresh process: ``import vmamba2d.export``, then the bare
    ``torch.onnx.export(model, x, dynamo=True)`` (no translation table) of both families, batch,
    height and width dynamic. Returns the folder of ``<name>.onnx`` files."""
    folder = tmp_path_factory.mktemp("bare")
    done = subprocess.run([sys.executable, "-c", BARE_EXPORT, str(folder), *FAMILIES], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def dynamic_export(request, bare_exports):
    """(model, session): the eager model (same seed and config as the exported one) and its file."""
    return create(request.param), onnx_session(bare_exports / f"{request.param}.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("batch, height, width", [(1, 64, 64), (3, 40, 72), (2, 33, 17)])
def test_dynamic_export_matches_eager_on_square_and_non_square_inputs(dynamic_export, batch, height, width):
    # one file: the batch size it was traced with (2) and others, any height / width
    model, session = dynamic_export
    assert max_relative_error(model, None, images(batch, height, width), session) <= TOLERANCE


def _domains(graph: onnx.GraphProto) -> set:
    """Domains of the graph's nodes and of their subgraphs' nodes (Scan bodies)."""
    domains = set()
    for node in graph.node:
        domains.add(node.domain)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                domains |= _domains(attr.g)
    return domains


@pytest.mark.slow  # its fixture exports both families in a child process (~20 s)
@pytest.mark.parametrize("name", FAMILIES)
def test_bare_export_is_checked_standard_onnx(bare_exports, name):
    model = onnx.load(str(bare_exports / f"{name}.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert not model.functions
    assert _domains(model.graph) == {""} and {imp.domain for imp in model.opset_import} == {""}


@pytest.mark.slow
def test_fixed_size_features_only_export_matches_and_rejects_other_sizes(tmp_path):
    model = create("vmamba2d_tiny", features_only=True, out_indices=(0, 1))
    path = export_onnx(model, tmp_path / "backbone.onnx", (48, 80))
    session = onnx_session(path)
    assert len(session.get_outputs()) == 2
    assert max_relative_error(model, None, images(2, 48, 80), session) <= TOLERANCE
    assert max_relative_error(model, None, images(5, 48, 80), session) <= TOLERANCE
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="dimensions"):
        session.run(None, {INPUT_NAME: images(1, 64, 80).numpy()})


@pytest.mark.slow
def test_per_route_model_exports_the_single_route_op_at_a_fixed_size(tmp_path):
    # cross_scan="per_route" calls vmamba2d::selective_scan_2d_fwd (one call per grid shape)
    model = create("vmamba2d_tiny", cross_scan="per_route")
    with pytest.raises(ValueError, match="per_route"):
        export_onnx(model, tmp_path / "refused.onnx", (40, 56), dynamic_size=True)
    assert not (tmp_path / "refused.onnx").exists()
    session = onnx_session(export_onnx(model, tmp_path / "per_route.onnx", (40, 56)))
    assert max_relative_error(model, None, images(2, 40, 56), session) <= TOLERANCE


@pytest.mark.slow
def test_cli_exports_a_checkpoint_and_checks_it(tmp_path, capsys):
    trained = create("vmamba_tiny")
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    checkpoint = tmp_path / "weights.pth"
    torch.save(trained.state_dict(), checkpoint)
    out = tmp_path / "model.onnx"
    code = export_onnx_cli.main([
        "vmamba_tiny", str(out), "--img-size", "32", "40", "--checkpoint", str(checkpoint),
        "--model-kwargs", "depths=[1,1]", "dims=16", "--dynamic", "--check",
    ])
    printed = capsys.readouterr().out
    assert code == 0
    assert "onnx.checker passed" in printed and printed.count("max relative error") == 3
    session = onnx_session(out)
    x = images(2, 24, 56)  # --dynamic: not the size it was traced at
    assert max_relative_error(trained, None, x, session) <= TOLERANCE
    got = session.run(None, {INPUT_NAME: x.numpy()})[0]
    with torch.no_grad():
        untrained = create("vmamba_tiny")(x).numpy()
    assert np.abs(got - untrained).max() > 1e-2  # the checkpoint's weights, not a fresh init


def test_export_functions_refuse_an_opset_below_18(tmp_path):
    # the exporter would write opset 18 instead (it cannot convert its Split nodes down)
    with pytest.raises(ValueError, match="opset must be None or an int >= 18, got 17"):
        export_onnx(create("vmamba2d_tiny"), tmp_path / "m.onnx", (32, 32), opset=17)
    with pytest.raises(ValueError, match="opset must be None or an int >= 18, got 17"):
        export_mil_onnx(MambaMIL2D(in_dim=8, num_classes=2, dim=16), tmp_path / "slide.onnx", opset=17)
    assert not list(tmp_path.iterdir())


def test_cli_refuses_clearly_without_the_onnx_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript -> ImportError
    code = export_onnx_cli.main(["vmamba2d_tiny", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert code == 2
    assert "missing: onnxscript" in err and 'pip install "vmamba2d[onnx]"' in err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("argv, message", [
    (["convnext_tiny", "m.onnx"], "vmamba2d_\\* / vmamba_\\* models or mambamil2d"),
    (["vmamba2d_tiny", "m.onnx", "--checkpoint", "missing.pth"], "--checkpoint must be an existing file"),
    (["vmamba2d_tiny", "m.onnx", "--img-size", "0", "32"], "--img-size must be two positive ints"),
    (["vmamba2d_tiny", "m.onnx", "--model-kwargs", "depths"], "--model-kwargs: expected KEY=VALUE"),
    (["vmamba2d_tiny", "m.onnx", "--opset", "17"], "--opset must be at least 18"),
    (["mambamil2d", "m.onnx", "--dynamic", "--img-size", "64", "64"], "--img-size --dynamic: image models only"),
    (["mambamil2d", "m.onnx", "--bench", "1"], "--bench bag sizes must be at least 2 patches"),
    (["mambamil2d", "m.onnx", "--checkpoint", __file__, "--model-kwargs", "in_dim=8"], "--checkpoint .* or --model-kwargs"),
])
def test_cli_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        export_onnx_cli.parse_args(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


IMPORT_WITHOUT_ONNXSCRIPT = """
import sys, warnings
sys.modules["onnxscript"] = None  # as if the onnx extra were not installed
warnings.simplefilter("error")
import vmamba2d.export
assert "onnx" not in sys.modules
try:
    vmamba2d.export.register_onnx_translations()
except vmamba2d.export.MissingOnnxExtraError as error:
    print(error)
"""


@pytest.mark.slow  # a child process / an export: seconds, more on a busy machine
def test_import_vmamba2d_needs_no_onnx_and_registering_refuses_clearly():
    done = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_ONNXSCRIPT], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "needs onnxscript" in done.stdout and 'pip install "vmamba2d[onnx]"' in done.stdout


def test_registering_on_an_untested_torch_refuses_clearly_and_import_only_warns(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    with pytest.raises(UntestedTorchError, match="custom_translation_table=vmamba2d.export.translation_table"):
        register_onnx_translations()
    with pytest.warns(RuntimeWarning, match="will not find the scan ops' ONNX translations"):
        register_if_onnx_installed()


def test_registering_again_is_a_no_op_and_another_translation_is_refused(monkeypatch):
    from onnxscript.function_libs.torch_lib import registration

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_onnx_translations()  # already done by import vmamba2d.export
    name = "vmamba2d::selective_scan_2d_fwd"
    assert [f.func for f in registration.default_registry[name].overloads] == [selective_scan_2d_onnx]
    other = registration.OverloadedFunction(name)
    other.overloads.append(object())
    monkeypatch.setitem(registration.default_registry._registry, name, other)
    with pytest.raises(RuntimeError, match="another ONNX translation is already registered"):
        register_onnx_translations()


def test_a_translation_onnxscript_cannot_read_is_not_registered(monkeypatch):
    # onnxscript reads every registered function's signature at each export: one it cannot read
    # would break the export of any model, so it must be refused at registration
    from onnxscript._internal.values import TracedOnnxFunction
    from onnxscript.function_libs.torch_lib import registration

    name = "vmamba2d::cross_selective_scan_2d_fwd"
    monkeypatch.delitem(registration.default_registry._registry, name)

    def unreadable(self):
        raise OSError("could not get source code")

    monkeypatch.setattr(TracedOnnxFunction, "function_ir", property(unreadable))
    with pytest.raises(RuntimeError, match="cannot read the signature of cross_selective_scan_2d_onnx"):
        register_onnx_translations()
    assert name not in registration.default_registry


@pytest.mark.slow  # a child process / an export: seconds, more on a busy machine
def test_cli_exports_a_mil_checkpoint_that_matches_eager_on_bags(tmp_path, capsys):
    # 2DMambaMIL with a survival head: n and the grid (read from the coords) are dynamic
    torch.manual_seed(0)
    model = MambaMIL2D(in_dim=8, num_classes=4, dim=16, d_state=4, attn_hidden=8, survival=True,
                       init="mamba").eval()
    checkpoint = tmp_path / "mil.pth"
    torch.save({"model": model.state_dict(), "model_config": model.config}, checkpoint)
    out = tmp_path / "slide.onnx"
    code = export_onnx_cli.main(["mambamil2d", str(out), "--checkpoint", str(checkpoint), "--check",
                                          "--bench", "30", "--iters", "1", "--threads", "1"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "onnx.checker passed" in printed and printed.count("max relative error") == 2
    assert re.search(r"30 patches on a 6x6 grid, 1 threads: onnxruntime [\d.]+ ms, eager PyTorch [\d.]+ ms", printed)
    session = onnx_session(out)
    assert [o.name for o in session.get_outputs()] == ["logits", "attention", "attention_scores", "embedding",
                                                       "hazards", "survival", "risk"]
    one_patch = (torch.randn(1, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([[2, 1]]))
    for features, coords in (random_bag(8, 2, (1, 2)), random_bag(8, 9, (9, 1), seed=1),
                             random_bag(8, 23, (4, 7), seed=2), one_patch):
        assert mil_max_relative_error(model, None, features, coords, session) <= TOLERANCE
    # an empty bag: the eager model's one-line error, not onnxruntime's Reshape failure
    with pytest.raises(ValueError, match="features is empty"):
        run_mil_onnx(session, torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.long))


class _Payload:
    def __reduce__(self):
        return (print, ("ran",))


def test_cli_reports_bad_checkpoints_and_model_arguments_in_one_line(tmp_path, capsys):
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(bytes(range(256)) * 8)
    payload = tmp_path / "payload.pth"
    torch.save({"model": _Payload()}, payload)
    wrong_dims = tmp_path / "wrong_dims.pth"
    torch.save(create("vmamba_tiny", dims=8).state_dict(), wrong_dims)
    small = ["--model-kwargs", "depths=[1,1]", "dims=16"]
    cases = [
        (["vmamba_tiny", "m.onnx", "--checkpoint", str(garbage), *small], "RuntimeError|UnpicklingError"),
        (["vmamba_tiny", "m.onnx", "--checkpoint", str(payload), *small], "Unsupported globals?: (GLOBAL )?(builtins\\.)?print"),
        (["vmamba_tiny", "m.onnx", "--checkpoint", str(wrong_dims), *small], "size mismatch|shape"),
        (["vmamba_tiny", "m.onnx", "--model-kwargs", "colour=3"], "colour"),
        (["mambamil2d", "m.onnx", "--model-kwargs", "in_dim=0", "num_classes=2"], "in_dim"),
    ]
    for argv, message in cases:
        argv[1] = str(tmp_path / argv[1])
        assert export_onnx_cli.main(argv) == 2, argv
        captured = capsys.readouterr()
        (line,) = captured.err.strip().splitlines()
        assert line.startswith(f"error: {argv[0]}") and re.search(message, line), line
        assert "ran" not in captured.out
    assert not (tmp_path / "m.onnx").exists()
    assert export_onnx_cli.main(["vmamba2d_tiny", str(tmp_path / "m.onnx"), "--opset", "99"]) == 2
    assert capsys.readouterr().err.startswith("error: --opset 99: the installed onnx knows opsets up to ")


def test_cli_refuses_an_output_path_it_cannot_write(tmp_path, capsys):
    for out, message in ((tmp_path, "(a folder)"), (tmp_path / "no" / "m.onnx", f"(no folder {tmp_path / 'no'})")):
        with pytest.raises(SystemExit) as exit_info:
            export_onnx_cli.parse_args(["vmamba2d_tiny", str(out)])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
