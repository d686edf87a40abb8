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

from test_seg import TINY_CONFIG, _load_script, _run_options, ade_root  # noqa: E402,F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]


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
    train = _load_script("train")
    truncated = tmp_path / "iter_2.pth"
    truncated.write_bytes(b"PK\x03\x04 the first bytes of a torch zip archive")
    argv = [str(TINY_CONFIG), "--from-scratch", "--work-dir", str(tmp_path / "work"), "--resume", str(truncated),
            "--cfg-options", *_run_options(ade_root, max_iters=2)]
    capsys.readouterr()
    assert train.main(argv) == 2
    errors = _error_lines(capsys)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"train.py: error: checkpoint {truncated} ({truncated.stat().st_size} bytes) "
                                "is not a complete torch checkpoint")
    assert errors[0].endswith("it was probably truncated by a killed write")  # the whole message on that line
    assert not (tmp_path / "work").exists()


def test_train_reports_a_work_dir_it_refuses_in_one_line(ade_root, tmp_path, capsys):
    train = _load_script("train")
    work = tmp_path / "work"
    work.mkdir()
    (work / "last_checkpoint").write_text(str(work / "iter_2.pth"))
    capsys.readouterr()
    assert train.main([str(TINY_CONFIG), "--from-scratch", "--work-dir", str(work),
                       "--cfg-options", *_run_options(ade_root, max_iters=2)]) == 2
    assert _error_lines(capsys) == [
        f"train.py: error: --work-dir {work} already holds a training run (last_checkpoint); pass --resume to "
        "continue it, or choose another --work-dir"]


def test_train_reports_a_refused_imagenet_checkpoint_in_one_line(ade_root, tmp_path, capsys):
    train = _load_script("train")
    executed = tmp_path / "executed"
    malicious = tmp_path / "imagenet.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "payload": _MakesFolder(executed)}, malicious)
    options = [o for o in _run_options(ade_root, max_iters=2) if o != "model.backbone.init_cfg=None"]
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
    test = _load_script("test")
    missing = tmp_path / "iter_9.pth"
    capsys.readouterr()
    assert test.main([str(TINY_CONFIG), str(missing), "--cfg-options", *_run_options(ade_root, max_iters=2)]) == 2
    assert _error_lines(capsys) == [f"test.py: error: checkpoint not found: {missing}"]


@pytest.mark.slow
def test_train_command_line_exits_2_without_a_traceback(ade_root, tmp_path):
    missing = tmp_path / "iter_2.pth"
    result = subprocess.run(
        [sys.executable, str(ROOT / "seg" / "train.py"), str(TINY_CONFIG), "--from-scratch", "--work-dir",
         str(tmp_path / "work"), "--resume", str(missing), "--cfg-options", *_run_options(ade_root, max_iters=2)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"train.py: error: checkpoint {missing} does not exist"
