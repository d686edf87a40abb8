"""The front door: vmamba2d-tiny-data's datasets, the shipped configs by name, vmamba2d-weights,
the one 'install the extra' message and the commands' entry points."""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vmamba2d import tiny_data
from vmamba2d.cli import configs as shipped
from vmamba2d.extras import MissingExtraError, install_command, require_extra

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    tiny_data.write_tiny_data(out, seed=0)
    return out


# --- vmamba2d-tiny-data ----------------------------------------------------------------------
def test_imagenet_folder_is_an_imagefolder_with_separable_classes(tiny):
    from torchvision.datasets import ImageFolder

    train, val = ImageFolder(str(tiny / "imagenet" / "train")), ImageFolder(str(tiny / "imagenet" / "val"))
    assert train.classes == sorted(tiny_data.IMAGENET_CLASSES) == val.classes
    assert len(train) == 8 * 4 and len(val) == 4 * 4
    # the class is recoverable from the mean colour (a property of the data, not of the writer)
    means = {c: [] for c in train.classes}
    for path, label in train.samples:
        means[train.classes[label]].append(np.asarray(Image.open(path), np.float64).mean((0, 1)))
    centres = {c: np.mean(v, 0) for c, v in means.items()}
    for path, label in val.samples:
        colour = np.asarray(Image.open(path), np.float64).mean((0, 1))
        nearest = min(centres, key=lambda c: np.linalg.norm(centres[c] - colour))
        assert nearest == val.classes[label]


def test_ade_layout_pairs_images_and_label_maps(tiny):
    for split, count in (("training", 8), ("validation", 4)):
        images = sorted((tiny / "ade" / "images" / split).glob("*.jpg"))
        labels = sorted((tiny / "ade" / "annotations" / split).glob("*.png"))
        assert [p.stem for p in images] == [p.stem for p in labels] and len(images) == count
        for image, label in zip(images, labels):
            array = np.asarray(Image.open(label))
            assert array.dtype == np.uint8 and array.ndim == 2 and array.max() <= 6
            assert Image.open(image).size == Image.open(label).size


def test_coco_layout_loads_in_pycocotools_with_the_80_categories(tiny):
    pycocotools = pytest.importorskip("pycocotools.coco")
    for split in ("train", "val"):
        coco = pycocotools.COCO(str(tiny / "coco" / "annotations" / f"instances_{split}2017.json"))
        assert len(coco.getCatIds()) == 80
        for image in coco.loadImgs(coco.getImgIds()):
            assert (tiny / "coco" / f"{split}2017" / image["file_name"]).is_file()
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=image["id"])):
                x, y, w, h = ann["bbox"]
                assert 0 <= x and 0 <= y and x + w <= image["width"] and y + h <= image["height"]
                assert coco.annToMask(ann).sum() == pytest.approx(w * h, rel=0.15)


def test_coco_category_names_are_mmdets():
    pytest.importorskip("vmamba2d.det")  # mmdet imports on mmcv-lite through its stand-in
    import mmdet.datasets as mmdet
    assert tuple(mmdet.CocoDataset.METAINFO["classes"]) == tiny_data.COCO_CATEGORIES


def test_mil_set_reads_with_the_mil_loaders(tiny):
    from vmamba2d.mil.data.slide_files import read_slide_file
    from vmamba2d.mil.data.tables import read_label_csv

    entries, _ = read_label_csv(tiny / "mil" / "labels.csv", label_map={"negative": 0, "positive": 1})
    assert len(entries) == sum(tiny_data.MIL_SPLITS.values())
    assert {split: sum(e.split == split for e in entries) for split in tiny_data.MIL_SPLITS} == tiny_data.MIL_SPLITS
    slide = read_slide_file(tiny / "mil" / "features" / f"{entries[0].slide_id}.pt")
    assert slide.features.shape[1] == 32 and slide.coords_px.shape == (slide.features.shape[0], 2)


def test_slides_read_as_whole_slide_images_with_tissue_and_the_labels_split(tmp_path):
    pytest.importorskip("tifffile")
    pytest.importorskip("tiffslide")
    from vmamba2d.mil.data.tables import read_label_csv
    from vmamba2d.mil.slides import open_slide

    root = tiny_data.write_tiny_data(tmp_path, only=["slides"])["slides"]
    entries, _ = read_label_csv(root / "labels.csv", label_map={"normal": 0, "tumour": 1})
    assert [e.split for e in entries] == list(tiny_data.SLIDE_SPLITS)
    assert {e.label for e in entries} == {0, 1}
    for entry in entries:
        with open_slide(root / "images" / f"{entry.slide_id}.tif") as slide:
            assert slide.dimensions == tiny_data.SLIDE_SIZE and slide.mpp == pytest.approx(0.5)
            assert len(slide.level_dimensions) >= 2
    assert "slides" not in tiny_data.write_tiny_data(tmp_path / "default", only=["mil"])


def test_same_seed_same_files_and_existing_folders_kept(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    tiny_data.write_tiny_data(first, only=["coco"], seed=3)
    tiny_data.write_tiny_data(second, only=["coco"], seed=3)
    name = "annotations/instances_train2017.json"
    assert json.loads((first / "coco" / name).read_text()) == json.loads((second / "coco" / name).read_text())
    with pytest.raises(FileExistsError, match="--overwrite"):
        tiny_data.write_tiny_data(first, only=["coco"])
    assert tiny_data.main([str(first), "--only", "coco"]) == 2
    with pytest.raises(ValueError, match="unknown"):
        tiny_data.write_tiny_data(first, only=["voc"])


# --- shipped configs --------------------------------------------------------------------------
def test_config_names_resolve_to_the_package_files(tmp_path, monkeypatch):
    seg = shipped.shipped_configs("seg")
    assert "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512" in seg and "_base_" not in " ".join(seg)
    assert all(p.is_file() and p.is_relative_to(shipped.CONFIG_ROOT) for p in seg.values())
    name = "mask-rcnn_vmamba2d-tiny_fpn_1x_coco"
    assert shipped.resolve_config("det", name) == str(shipped.CONFIG_ROOT / "det" / f"{name}.py")
    assert shipped.resolve_config("det", name + ".py") == str(shipped.CONFIG_ROOT / "det" / f"{name}.py")
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{name}.py").write_text("# a user's own file of that name wins\n")
    assert shipped.resolve_config("det", f"{name}.py") == f"{name}.py"
    assert shipped.resolve_config("det", "missing_config") == "missing_config"
    assert shipped.config_listing("classification").splitlines()[0].startswith("vmamba2d_base ")


def test_classification_and_mil_configs_are_the_shipped_ones():
    from vmamba2d.classification import config as classification_config
    from vmamba2d.mil import config as mil_config

    assert classification_config.CONFIG_DIR == shipped.CONFIG_ROOT / "classification"
    assert mil_config.CONFIG_DIR == shipped.CONFIG_ROOT / "mil"


def test_list_prints_the_configs_without_the_toolkit(capsys):
    from vmamba2d.cli import openmmlab

    assert openmmlab.seg_train(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert "tiny-data_upernet_vmamba2d_tiny" in listed and "mask-rcnn_vmamba2d-tiny_fpn_1x_coco" not in listed


# --- one message for a missing extra -----------------------------------------------------------
def test_mil_cli_without_scikit_learn_names_the_extra(monkeypatch):
    import importlib.util
    import sys

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real_find_spec(name, *a))
    monkeypatch.delitem(sys.modules, "vmamba2d.mil.metrics", raising=False)
    with pytest.raises(MissingExtraError, match=r'scikit-learn\): pip install "vmamba2d\[mil\]"'):
        importlib.import_module("vmamba2d.mil.metrics")
    monkeypatch.delitem(sys.modules, "vmamba2d.mil.metrics", raising=False)


def test_missing_extra_names_the_modules_and_the_quoted_install_command():
    with pytest.raises(MissingExtraError) as caught:
        require_extra("vmamba2d.seg", ("json", "no_such_module_xyz"), "seg", "mmsegmentation 1.2.2")
    assert str(caught.value) == ('vmamba2d.seg needs no_such_module_xyz (mmsegmentation 1.2.2): '
                                 'pip install "vmamba2d[seg]"')
    assert isinstance(caught.value, ImportError) and install_command("mil") == 'pip install "vmamba2d[mil]"'


def test_no_install_hint_of_another_form_in_the_package():
    """Every install hint in the package's messages has the one form (no `-e .[x]`, no bare names)."""
    offenders = []
    for path in (REPO / "vmamba2d").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "pip install -e" in line or "pip install 'vmamba2d[" in line:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# --- entry points -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_entry_point_resolves_to_a_callable(name):
    import importlib

    module, attr = SCRIPTS[name].split(":")
    if "openmmlab" in module or "weights" in module:
        pytest.importorskip("mmengine")
    target = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    assert callable(target)


# --- vmamba2d-weights ---------------------------------------------------------------------------
@pytest.fixture()
def small_config(tmp_path) -> Path:
    pytest.importorskip("mmengine")
    config = tmp_path / "small_seg.py"
    config.write_text(
        "model = dict(backbone=dict(model_name='vmamba2d_tiny', model_kwargs=dict(dims=16, depths=(1, 1, 1, 1)),\n"
        "                           init_cfg=dict(type='Pretrained', checkpoint='weights/small_in1k.pth')))\n")
    return config


def _small_model(name: str) -> torch.nn.Module:
    import timm

    import vmamba2d.models  # noqa: F401

    torch.manual_seed(0)
    return timm.create_model(name, num_classes=5, dims=16, depths=(1, 1, 1, 1))


def test_weights_prints_where_the_file_goes(small_config, tmp_path, monkeypatch, capsys):
    from vmamba2d.cli import weights

    monkeypatch.chdir(tmp_path)
    assert weights.main([str(small_config)]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "weights" / "small_in1k.pth") in out and "(missing)" in out
    assert "--from" in out and "--from-scratch" in out


def test_weights_converts_a_checkpoint_that_the_backbone_then_loads(small_config, tmp_path, monkeypatch, capsys):
    from vmamba2d.cli import weights

    monkeypatch.chdir(tmp_path)
    trained = _small_model("vmamba_tiny")  # a VMamba checkpoint initialises the 2DVMamba backbone
    torch.save({"model": trained.state_dict(), "epoch": 3}, tmp_path / "trained.pth")
    assert weights.main([str(small_config), "--from", str(tmp_path / "trained.pth")]) == 0
    written = torch.load(tmp_path / "weights" / "small_in1k.pth", weights_only=True)
    backbone = {k: v for k, v in trained.state_dict().items() if not k.startswith(("head.", "norm."))}
    assert written.keys() == backbone.keys()
    assert all(torch.equal(written[k], backbone[k]) for k in backbone)
    # an existing file is kept
    assert weights.main([str(small_config), "--from", str(tmp_path / "trained.pth")]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err


def test_weights_refuses_a_checkpoint_of_another_size(small_config, tmp_path, monkeypatch, capsys):
    import timm

    from vmamba2d.cli import weights

    monkeypatch.chdir(tmp_path)
    other = timm.create_model("vmamba2d_tiny", num_classes=5, dims=24, depths=(1, 1, 1, 1))
    torch.save(other.state_dict(), tmp_path / "other.pth")
    assert weights.main([str(small_config), "--from", str(tmp_path / "other.pth")]) == 2
    err = capsys.readouterr().err
    assert "does not fit vmamba2d_tiny's backbone" in err and "other shapes" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "weights").exists()


def test_weights_names_the_shipped_configs_for_an_unknown_one(capsys):
    pytest.importorskip("mmengine")
    from vmamba2d.cli import weights

    assert weights.main(["no_such_config"]) == 2
    assert "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512" in capsys.readouterr().err


# --- quiet by default ---------------------------------------------------------------------------
@pytest.mark.slow
def test_openmmlab_import_prints_no_stand_in_warning():
    pytest.importorskip("mmengine")
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-W", "always", "-c",
                             "import vmamba2d.seg, vmamba2d.det; from vmamba2d.openmmlab.mmcv_standin.install import "
                             "compat_layer_active, compiled_mmcv_ops_available; "
                             "print(compat_layer_active() or compiled_mmcv_ops_available())"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and result.stdout.split()[-1] == "True", result.stderr[-2000:]
    assert "stand-in" not in result.stderr, result.stderr[-2000:]


def test_mmengine_counters_support_the_scan_ops():
    """mmengine's FLOP and activation passes (mmseg / mmdet get_flops) count our ops: none of them is
    'unsupported'; the activations include the scans' outputs."""
    pytest.importorskip("mmengine")
    import timm

    import vmamba2d.seg  # noqa: F401  (registers the handles)
    from mmengine.analysis import ActivationAnalyzer, FlopAnalyzer

    from vmamba2d.ops import backend_info

    if backend_info().get("auto_cpu") != "cpu":
        pytest.skip("needs the compiled CPU kernel (the traced scan op)")
    model = timm.create_model("vmamba2d_tiny", dims=16, depths=(1, 1, 1, 1), num_classes=0).eval()
    inputs = (torch.randn(1, 3, 64, 64),)
    for analyzer in (FlopAnalyzer(model, inputs), ActivationAnalyzer(model, inputs)):
        analyzer.total()
        ours = [name for name in analyzer.unsupported_ops() if name.startswith("vmamba2d::")]
        assert not ours, (type(analyzer).__name__, ours)
    by_operator = ActivationAnalyzer(model, inputs).by_operator()
    scans = sum(count for name, count in by_operator.items() if "selective_scan" in name)
    assert scans > 0, dict(by_operator)


# --- COCO files with fewer categories than the config's classes ---------------------------------
def test_coco_file_with_fewer_categories_stops_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("vmamba2d.det")
    from vmamba2d.cli import openmmlab
    from vmamba2d.det.runtime import coco_category_names

    monkeypatch.chdir(tmp_path)
    tiny_data.write_tiny_data(tmp_path / "data" / "tiny", only=["coco"])
    train_json = tmp_path / "data" / "tiny" / "coco" / "annotations" / "instances_train2017.json"
    assert coco_category_names(train_json) == list(tiny_data.COCO_CATEGORIES)
    content = json.loads(train_json.read_text())
    content["categories"] = [c for c in content["categories"] if c["name"] in tiny_data.COCO_USED]
    train_json.write_text(json.dumps(content))
    code = openmmlab.det_train(["tiny-data_mask-rcnn_vmamba2d-tiny_fpn", "--from-scratch",
                                "--work-dir", str(tmp_path / "work")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "has 4 of the config's 80 classes" in err and "metainfo.classes" in err and "num_classes" in err


def test_quiet_evaluation_logs_warnings_only_and_shows_a_progress_bar(capsys):
    pytest.importorskip("mmengine")
    from types import SimpleNamespace

    from mmengine.config import Config
    from mmengine.registry import HOOKS

    from vmamba2d.openmmlab.progress import quiet_evaluation

    cfg = Config(dict(log_level="INFO", custom_hooks=[dict(type="EMAHook")]))
    quiet_evaluation(cfg)
    assert cfg.log_level == "WARNING"
    assert [hook["type"] for hook in cfg.custom_hooks] == ["EMAHook", "TestProgressBarHook"]
    assert "TestProgressBarHook" in cfg.pretty_text  # the config still dumps (a class object would not)
    hook = HOOKS.build(cfg.custom_hooks[1])
    runner = SimpleNamespace(test_dataloader=[None] * 3)
    hook.before_test_epoch(runner)
    for batch in range(3):
        hook.after_test_iter(runner, batch)
    hook.after_test_epoch(runner)
    assert "3/3" in capsys.readouterr().err


def test_missing_backbone_weights_name_both_ways_out(tmp_path, monkeypatch, capsys):
    pytest.importorskip("vmamba2d.seg")
    from vmamba2d.cli import openmmlab

    monkeypatch.chdir(tmp_path)
    name = "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512"
    assert openmmlab.seg_train([name, "--work-dir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pretrained/vmamba2d_tiny_in1k.pth" in err
    assert f"vmamba2d-weights {name}.py --from FILE" in err and "--from-scratch" in err


# --- every `python -m vmamba2d....` entry point answers --help -----------------------------------
MAIN_MODULES = sorted(
    ".".join(path.relative_to(REPO).with_suffix("").parts)
    for path in (REPO / "vmamba2d").rglob("*.py") if 'if __name__ == "__main__":' in path.read_text())
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
found = {}
for module in sys.argv[1:]:
    out, code = io.StringIO(), "returned without exiting"
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code
    found[module] = [code, out.getvalue()]
print(json.dumps(found))
"""


@pytest.mark.slow
def test_every_module_entry_point_prints_its_usage_for_help():
    import subprocess
    import sys

    assert "vmamba2d.classification.train" in MAIN_MODULES and "vmamba2d.mil.cli" in MAIN_MODULES
    result = subprocess.run([sys.executable, "-c", HELP_RUNNER, *MAIN_MODULES], capture_output=True, text=True,
                            timeout=900, env={**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    silent = {m: code for m, (code, text) in found.items() if code not in (0, None) or "usage:" not in text}
    assert not silent, silent


def test_version_names_the_toolkit_and_what_runs_mmcv_ops(capsys):
    pytest.importorskip("vmamba2d.seg")
    import importlib.metadata as metadata

    import vmamba2d
    from vmamba2d.cli import openmmlab
    from vmamba2d.openmmlab.mmcv_standin.install import compat_layer_active

    assert openmmlab.seg_test(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"vmamba2d {vmamba2d.__version__}, torch {metadata.version('torch')}, ")
    assert f"mmseg {metadata.version('mmsegmentation')}" in line
    assert line.endswith("PyTorch stand-in (mmcv-lite has no compiled ops)" if compat_layer_active() else "compiled")


@pytest.mark.slow
def test_every_installed_command_shows_examples_in_its_help():
    import subprocess
    import sys

    collector = """
import contextlib, io, json, sys
found = {}
for name, entry in json.loads(sys.argv[1]).items():
    module, attr = entry.split(":")
    out = io.StringIO()
    sys.argv = [name, "--help"]
    with contextlib.redirect_stdout(out):
        try:
            getattr(__import__(module, fromlist=["_"]), attr)(["--help"])
        except SystemExit:
            pass
    found[name] = out.getvalue()
print(json.dumps(found))
"""
    scripts = {name: entry for name, entry in SCRIPTS.items()
               if not ("openmmlab" in entry or "weights" in entry) or importlib_available("mmengine")}
    result = subprocess.run([sys.executable, "-c", collector, json.dumps(scripts)], capture_output=True, text=True,
                            timeout=900, env={**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr[-3000:]
    helps = json.loads(result.stdout.strip().splitlines()[-1])
    without = [name for name, text in helps.items() if "usage:" not in text or "example" not in text.lower()]
    assert not without, without


def importlib_available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
