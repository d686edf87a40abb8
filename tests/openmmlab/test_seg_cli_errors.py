"""seg/train.py and seg/test.py report bad input (a missing or unreadable checkpoint, a refused
ImageNet checkpoint, a work dir that cannot be started or resumed as asked) in one line on stderr
naming the path, exit code 2, without a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmseg", reason="the seg extra (mmsegmentation, mmengine, mmcv) is not installed")

from support.seg_runs import TINY_CONFIG, load_seg_script, run_options  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class _MakesFolder:
    """Unpickling it runs ``os.mkdir(path)``: stands for any code a malicious checkpoint executes."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _error_lines(capsys) -> list:
    """The ``<script>: error:`` lines written to stderr (mmengine's loggers of earlier in-process runs
    may write there too)."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(("train.py:", "test.py:"))]


def test_train_reports_an_unreadable_resume_checkpoint_in_one_line(ade_root, tmp_path, capsys):
    train = load_seg_script("train")
    truncated = tmp_path / "iter_2.pth"
    truncated.write_bytes(b"PK\x03\x04 the first bytes of a torch zip archive")
    argv = [str(TINY_CONFIG), "--from-scratch", "--work-dir", str(tmp_path / "work"), "--resume", str(truncated),
            "--cfg-options", *run_options(ade_root, max_iters=2)]
    capsys.readouterr()
    assert train.main(argv) == 2
    errors = _error_lines(capsys)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"train.py: error: checkpoint {truncated} ({truncated.stat().st_size} bytes) "
                                "is not a complete torch checkpoint")
    assert errors[0].endswith("it was probably truncated by a killed write")  # the whole message on that line
    assert not (tmp_path / "work").exists()


def test_train_reports_a_work_dir_it_refuses_in_one_line(ade_root, tmp_path, capsys):
    train = load_seg_script("train")
    work = tmp_path / "work"
    work.mkdir()
    (work / "last_checkpoint").write_text(str(work / "iter_2.pth"))
    capsys.readouterr()
    assert train.main([str(TINY_CONFIG), "--from-scratch", "--work-dir", str(work),
                       "--cfg-options", *run_options(ade_root, max_iters=2)]) == 2
    assert _error_lines(capsys) == [
        f"train.py: error: --work-dir {work} already holds a training run (last_checkpoint); pass --resume to "
        "continue it, or choose another --work-dir"]


@pytest.mark.slow
def test_train_reports_a_refused_imagenet_checkpoint_in_one_line(ade_root, tmp_path, capsys):
    train = load_seg_script("train")
    executed = tmp_path / "executed"
    malicious = tmp_path / "imagenet.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "payload": _MakesFolder(executed)}, malicious)
    options = [o for o in run_options(ade_root, max_iters=2) if o != "model.backbone.init_cfg=None"]
    capsys.readouterr()
    assert train.main([str(TINY_CONFIG), "--work-dir", str(tmp_path / "work"), "--cfg-options", *options,
                       f"model.backbone.init_cfg.checkpoint={malicious}"]) == 2
    errors = _error_lines(capsys)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"train.py: error: {malicious} holds Python objects that "
                                "torch.load(weights_only=True) refuses (")
    assert errors[0].endswith("or re-save just its state dict.")  # the whole message on that line
    assert not executed.exists()


def test_test_reports_a_missing_checkpoint_in_one_line(ade_root, tmp_path, capsys):
    test = load_seg_script("test")
    missing = tmp_path / "iter_9.pth"
    capsys.readouterr()
    assert test.main([str(TINY_CONFIG), str(missing), "--cfg-options", *run_options(ade_root, max_iters=2)]) == 2
    assert _error_lines(capsys) == [f"test.py: error: checkpoint not found: {missing}"]


@pytest.mark.slow
def test_train_command_line_exits_2_without_a_traceback(ade_root, tmp_path):
    missing = tmp_path / "iter_2.pth"
    result = subprocess.run(
        [sys.executable, str(ROOT / "seg" / "train.py"), str(TINY_CONFIG), "--from-scratch", "--work-dir",
         str(tmp_path / "work"), "--resume", str(missing), "--cfg-options", *run_options(ade_root, max_iters=2)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"train.py: error: checkpoint {missing} does not exist"


def _tiny_segmentor_state(ade_root) -> dict:
    """The state dict of the tiny segmentor the test options build (random init)."""
    from mmengine.config import Config
    from support.seg_runs import build

    cfg = Config.fromfile(str(TINY_CONFIG))
    cfg.merge_from_dict(_options_dict(run_options(ade_root, max_iters=2)))
    return build(cfg.model).state_dict()


def _options_dict(options: list) -> dict:
    from mmengine.config import DictAction
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--o", nargs="+", action=DictAction)
    return parser.parse_args(["--o", *options]).o


@pytest.mark.slow
def test_train_starts_from_load_from_through_the_safe_loader(ade_root, tmp_path, capsys):
    train = load_seg_script("train")
    state = _tiny_segmentor_state(ade_root)
    state["decode_head.conv_seg.weight"] = torch.full_like(state["decode_head.conv_seg.weight"], 0.25)
    weights = tmp_path / "start.pth"
    torch.save({"state_dict": state}, weights)
    work = tmp_path / "work"
    assert train.main([str(TINY_CONFIG), "--work-dir", str(work), "--cfg-options",
                       *run_options(ade_root, max_iters=2), f"load_from={weights}",
                       "optim_wrapper.optimizer.lr=0.0"]) == 0
    trained = torch.load(work / "iter_2.pth", weights_only=True)["state_dict"]
    # lr 0: the weights are load_from's, which are not what the random init draws
    assert torch.equal(trained["decode_head.conv_seg.weight"], state["decode_head.conv_seg.weight"])
    first_backbone_weight = next(key for key in state if key.startswith("backbone.") and key.endswith("weight"))
    assert torch.equal(trained[first_backbone_weight], state[first_backbone_weight])
    (dumped,) = work.glob("*.py")  # the Runner's copy of the config
    assert f"load_from = '{weights}'" in dumped.read_text()


def test_train_and_test_refuse_a_checkpoint_of_another_model_in_one_line(ade_root, tmp_path, capsys):
    classification = tmp_path / "last.pth"
    torch.save({"model": {"stem.weight": torch.zeros(8, 3, 4, 4)}}, classification)
    total = len(_tiny_segmentor_state(ade_root))
    capsys.readouterr()
    assert load_seg_script("test").main([str(TINY_CONFIG), str(classification), "--work-dir", str(tmp_path / "t"),
                                      "--cfg-options", *run_options(ade_root, max_iters=2)]) == 2
    (line,) = _error_lines(capsys)
    assert line == (f"test.py: error: checkpoint {classification} holds 0 of the model's {total} weights (0%; at "
                    "least 90% needed): it is not a checkpoint of this model (an ImageNet classification "
                    "checkpoint belongs in model.backbone.init_cfg.checkpoint)")
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(tmp_path / "w"), "--cfg-options",
                                       *run_options(ade_root, max_iters=2), f"load_from={classification}"]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith(f"train.py: error: load_from {classification} holds 0 of the model's {total} weights")
    assert not list((tmp_path / "w").glob("iter_*.pth"))
    missing = tmp_path / "none.pth"
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(tmp_path / "w2"), "--cfg-options",
                                       *run_options(ade_root, max_iters=2), f"load_from={missing}"]) == 2
    assert _error_lines(capsys) == [f"train.py: error: load_from: checkpoint not found (only local files are "
                                    f"loaded): {missing}"]
    assert not (tmp_path / "w2").exists()


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["annotations/training/im1.png", "images/training/im2.jpg"])
def test_a_garbage_training_file_stops_training_in_one_line_naming_it(ade_root, tmp_path, capsys, bad):
    import shutil

    data = Path(shutil.copytree(ade_root, tmp_path / "ade"))
    (data / bad).write_bytes(b"\x89PNG\r\n\x1a\n garbage, not an image" * 4)
    capsys.readouterr()
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(tmp_path / "work"), "--cfg-options",
                                       *run_options(data, max_iters=2)]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith("train.py: error: bad sample ") and str(data / bad) in line, line
    assert "Fix or remove the file" in line


def test_an_empty_dataset_file_is_refused_before_anything_is_written(ade_root, tmp_path, capsys):
    import shutil

    data = Path(shutil.copytree(ade_root, tmp_path / "ade"))
    (data / "annotations" / "validation" / "im0.png").write_bytes(b"")
    capsys.readouterr()
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(tmp_path / "work"), "--cfg-options",
                                       *run_options(data, max_iters=2)]) == 2
    assert _error_lines(capsys) == [f"train.py: error: val_dataloader: {data / 'annotations/validation/im0.png'} "
                                    "is empty (0 bytes); restore or remove it"]
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("option, message", [
    ("train_dataloader.batch_size=0", "train_dataloader.batch_size must be a positive int, got 0"),
    ("optim_wrapper.optimizer.lr=nan", "optim_wrapper.optimizer.lr must be a finite number >= 0, got nan"),
    ("train_cfg.max_iters=-1", "train_cfg.max_iters must be a positive int, got -1"),
    ("model.backbone.colour=3", "model.backbone: VMamba2DBackbone takes no colour (it takes "),
])
def test_train_options_mmengine_would_fail_on_are_refused_in_one_line(ade_root, tmp_path, capsys, option, message):
    capsys.readouterr()
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(tmp_path / "work"), "--cfg-options",
                                       *run_options(ade_root, max_iters=2), option]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith(f"train.py: error: {message}"), line
    assert not (tmp_path / "work").exists()


def test_a_config_syntax_error_and_a_file_as_work_dir_are_one_line(ade_root, tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text(f"_base_ = [{str(TINY_CONFIG)!r}]\nmodel = dict(\n")
    capsys.readouterr()
    assert load_seg_script("train").main([str(broken), "--work-dir", str(tmp_path / "work")]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith(f"train.py: error: config file {broken} is not valid Python: "), line
    in_the_way = tmp_path / "file"
    in_the_way.write_text("not a folder")
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(in_the_way), "--cfg-options",
                                       *run_options(ade_root, max_iters=2)]) == 2
    assert _error_lines(capsys) == [f"train.py: error: --work-dir {in_the_way}: a file is in the way (a folder "
                                    "is needed)"]


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_is_one_line(ade_root, tmp_path, capsys, monkeypatch):
    import errno

    from vmamba2d.openmmlab.safe_checkpoints import AtomicLocalBackend

    def full(self, obj, filepath):
        raise OSError(errno.ENOSPC, "No space left on device", f"{filepath}")

    monkeypatch.setattr(AtomicLocalBackend, "put", full)
    work = tmp_path / "work"
    capsys.readouterr()
    assert load_seg_script("train").main([str(TINY_CONFIG), "--work-dir", str(work), "--cfg-options",
                                       *run_options(ade_root, max_iters=2)]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith(f"train.py: error: cannot write into {work}: No space left on device ("), line
    assert not (work / "last_checkpoint").exists()
