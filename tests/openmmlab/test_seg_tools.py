"""mmsegmentation's own tools with mmcv-lite and our configs, through vmamba2d.seg.mmseg_tools
(get_flops, print_config, browse_dataset, benchmark) and in a user script (init_model /
inference_model after `import vmamba2d.seg`). Tiny model and data, CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mmseg", reason="the seg extra (mmsegmentation, mmengine, mmcv) is not installed")

import vmamba2d.seg  # noqa: E402,F401
from mmengine.config import Config  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402
from mmseg.registry import MODELS  # noqa: E402
from vmamba2d.seg.mmseg_tools import mmseg_tools_dir, resolve_tool, run_tool  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "vmamba2d" / "configs" / "seg" / "upernet_vmamba2d_tiny_4xb4-160k_ade20k-512x512.py"
# the config's model shrunk to backbone dims 16..128 and one block per stage
TINY_MODEL = dict(
    backbone=dict(init_cfg=None, model_kwargs=dict(dims=16, depths=[1, 1, 1, 1])),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=32),
    auxiliary_head=dict(in_channels=64, channels=16),
)
TINY_OPTIONS = [
    "model.backbone.init_cfg=None",
    "model.backbone.model_kwargs.dims=16",
    "model.backbone.model_kwargs.depths=[1,1,1,1]",
    "model.decode_head.in_channels=[16,32,64,128]",
    "model.decode_head.channels=32",
    "model.auxiliary_head.in_channels=64",
    "model.auxiliary_head.channels=16",
]


@pytest.fixture(scope="module")
def ade_root(tmp_path_factory) -> Path:
    """ADE20K's layout with 2 training and 2 validation images (64 x 96), labels 0..4 in blocks."""
    import cv2

    root = tmp_path_factory.mktemp("ade_tools")
    rng = np.random.default_rng(0)
    for split in ("training", "validation"):
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for i in range(2):
            label = np.zeros((64, 96), np.uint8)
            label[:32] = 1 + i
            label[32:, :48] = 4
            image = (label[..., None] * 50 + rng.integers(0, 30, (64, 96, 3))).astype(np.uint8)
            cv2.imwrite(str(root / "images" / split / f"{split}_{i}.jpg"), image)
            cv2.imwrite(str(root / "annotations" / split / f"{split}_{i}.png"), label)
    return root


def _python(args: list, cwd: Path) -> subprocess.CompletedProcess:
    """Run the venv's python in a fresh process (nothing of this test process imported)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_tools_are_found_in_the_installed_mmseg_and_names_resolve():
    tools = mmseg_tools_dir()
    assert (tools / "analysis_tools" / "get_flops.py").is_file()
    assert resolve_tool("get_flops") == tools / "analysis_tools" / "get_flops.py"
    assert resolve_tool("misc/print_config") == tools / "misc" / "print_config.py"
    with pytest.raises(ValueError, match="ambiguous: analysis_tools/browse_dataset.py, misc/browse_dataset.py"):
        resolve_tool("browse_dataset")
    with pytest.raises(ValueError, match="matches no tool.*get_flops.py"):
        resolve_tool("get_flop")


@pytest.mark.slow
def test_print_config_with_model_graph_through_the_repository_wrapper(tmp_path):
    """Run directly, mmseg's print_config dies importing mmseg.apis (mmcv._ext) before the
    config's custom_imports; through seg/mmseg_tool.py it prints the config and builds the model
    with mmseg.apis.init_model (--graph)."""
    done = _python([str(ROOT / "seg" / "mmseg_tool.py"), "misc/print_config.py", str(CONFIG), "--graph"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "model_name='vmamba2d_tiny'" in done.stdout
    assert "Model graph:" in done.stdout and "(backbone): VMamba2DBackbone(" in done.stdout
    assert (tmp_path / "example.py").is_file() and (tmp_path / "example-graph.txt").is_file()


def _format_size(flops: int) -> str:
    from mmengine.analysis.print_helper import _format_size

    return _format_size(flops)


@pytest.mark.slow
def test_get_flops_tool_counts_the_scan_like_seg_get_flops(tmp_path, monkeypatch, capsys):
    from vmamba2d.ops import backend_info
    from vmamba2d.openmmlab.complexity import segmentor_complexity

    if not backend_info()["cpu_extension"]:
        pytest.skip("the compiled CPU scan kernel is not available: the scan op cannot be traced")
    monkeypatch.chdir(tmp_path)
    run_tool("analysis_tools/get_flops.py", [str(CONFIG), "--shape", "64", "96", "--cfg-options", *TINY_OPTIONS,
                                             "model.data_preprocessor.size=(64,96)"])
    printed = capsys.readouterr().out
    cfg = Config.fromfile(str(CONFIG))
    cfg.merge_from_dict(dict(model=TINY_MODEL))
    with DefaultScope.overwrite_default_scope("mmseg"):
        reference = segmentor_complexity(MODELS.build(cfg.model), (64, 96))  # fvcore + our scan handle
    scan = reference["flops_by_operator"]["cross_selective_scan_2d_fwd"]
    # the scan is a visible share of the total: without its handle the printed number would differ
    assert _format_size(reference["flops"] - scan) != _format_size(reference["flops"])
    assert f"Flops: {_format_size(reference['flops'])}\n" in printed
    assert f"Params: {_format_size(reference['params_inference'])}\n" in printed
    assert "Input shape: (64, 96)" in printed


def test_browse_dataset_tool_draws_the_training_samples(ade_root, tmp_path, monkeypatch):
    import cv2

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "vis"
    run_tool("analysis_tools/browse_dataset.py", [
        str(CONFIG), "--not-show", "--output-dir", str(out), "--cfg-options",
        f"train_dataloader.dataset.data_root={ade_root}", "train_dataloader.dataset.pipeline.2.scale=(128,64)",
        "train_dataloader.dataset.pipeline.2.ratio_range=(1.0,1.0)",  # 64 x 96 images: a full 48 x 48 crop
        "train_dataloader.dataset.pipeline.3.crop_size=(48,48)"])
    drawn = sorted(out.iterdir())
    assert [p.name for p in drawn] == ["training_0.jpg", "training_1.jpg"]
    for path in drawn:
        image = cv2.imread(str(path))
        assert image is not None and image.shape == (48, 48, 3)  # the random crop, with its labels drawn


def _benchmark_config(tmp_path: Path, ade_root: Path) -> Path:
    """A config on top of ours: tiny model; test set = the 2 validation images repeated 100 times
    (benchmark.py times 200 images after 5 warm-up ones and reports nothing for fewer). The data
    preprocessor's pad size is the images' size: benchmark.py preprocesses with training=True,
    which pads to ``size``, and mmseg then crops that padding off the smaller image's logits."""
    path = tmp_path / "bench_config.py"
    path.write_text(textwrap.dedent(f"""\
        _base_ = [{str(CONFIG)!r}]
        model = {dict(TINY_MODEL, data_preprocessor=dict(size=(64, 96)))!r}
        test_dataloader = dict(
            _delete_=True, batch_size=1, num_workers=0, persistent_workers=False,
            sampler=dict(type='DefaultSampler', shuffle=False),
            dataset=dict(type='RepeatDataset', times=100, dataset=dict(
                type='ADE20KDataset', data_root={str(ade_root)!r},
                data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
                pipeline=[dict(type='LoadImageFromFile'),
                          dict(type='Resize', scale=(128, 64), keep_ratio=True),
                          dict(type='LoadAnnotations', reduce_zero_label=True),
                          dict(type='PackSegInputs')])))
        """))
    return path


@pytest.mark.slow
def test_benchmark_tool_on_cpu(ade_root, tmp_path, monkeypatch, capsys, one_thread):
    config = _benchmark_config(tmp_path, ade_root)
    cfg = Config.fromfile(str(config))
    with DefaultScope.overwrite_default_scope("mmseg"):
        model = MODELS.build(cfg.model)
    torch.save({"meta": {}, "state_dict": model.state_dict()}, tmp_path / "tiny.pth")
    monkeypatch.chdir(tmp_path)
    run_tool("analysis_tools/benchmark.py", [str(config), str(tmp_path / "tiny.pth"), "--work-dir", str(tmp_path / "b"),
                                             "--log-interval", "100"])
    printed = capsys.readouterr().out
    assert "Done image [100/ 200]" in printed and "Overall fps" in printed
    result = json.loads(next((tmp_path / "b").glob("fps_*.json")).read_text())
    assert result["unit"] == "img / s" and result["average_fps"] > 0


@pytest.mark.slow
def test_user_script_with_the_one_line_import_runs_mmseg_apis(tmp_path):
    """`import vmamba2d.seg` first, then mmseg.apis as in mmseg's docs (fresh process, CPU)."""
    cfg = Config.fromfile(str(CONFIG))
    cfg.merge_from_dict(dict(model=TINY_MODEL))
    with DefaultScope.overwrite_default_scope("mmseg"):
        model = MODELS.build(cfg.model)
    torch.save({"meta": {}, "state_dict": model.state_dict()}, tmp_path / "tiny.pth")
    script = tmp_path / "infer.py"
    script.write_text(textwrap.dedent(f"""\
        import vmamba2d.seg  # before mmseg: mmcv-lite compatibility, VMamba backbones
        import numpy as np
        from mmseg.apis import inference_model, init_model

        model = init_model({str(CONFIG)!r}, {str(tmp_path / "tiny.pth")!r}, device="cpu",
                           cfg_options={dict(model=TINY_MODEL)!r})
        image = np.random.default_rng(0).integers(0, 255, (70, 90, 3), dtype=np.uint8)
        result = inference_model(model, image)
        print("prediction", tuple(result.pred_sem_seg.data.shape), int(result.pred_sem_seg.data.max()))
        """))
    done = _python([str(script)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    shape, top = done.stdout.split("prediction ")[1].rsplit(" ", 1)
    assert shape == "(1, 70, 90)" and 0 <= int(top) < 150


def test_tracing_with_a_pure_pytorch_scan_warns_that_flop_counters_miss_the_scans(monkeypatch):
    from vmamba2d.openmmlab import complexity
    from vmamba2d.seg import VMamba2DBackbone

    monkeypatch.setattr(complexity, "_warned_untraceable", False)
    backbone = VMamba2DBackbone("vmamba2d_tiny", model_kwargs=dict(dims=8, depths=(1, 1, 1, 1), scan_backend="torch"))
    image = torch.randn(1, 3, 32, 32)
    with pytest.warns(RuntimeWarning, match="torch scan backend: FLOP counters .* will not count"):
        torch.jit.trace(backbone.eval(), image, check_trace=False, strict=False)
    monkeypatch.setattr(complexity, "_warned_untraceable", False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*FLOP counters")
        backbone(image)  # not tracing: no warning
