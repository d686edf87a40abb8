"""vmamba2d.runs.run_lock: one run per folder, refused in one line while another process holds
it; the lock dies with its process. The CLIs' own use of it: here classification and MIL, seg and
det in tests/openmmlab/test_seg_runs.py and tests/openmmlab/test_det.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support.run_lock_holder import lock_held_by_another_process
from support.tiny_imagefolder import make_tiny_imagefolder
from vmamba2d.classification import train as train_cli
from vmamba2d.mil.cli import train_main as mil_train_main
from vmamba2d.mil.synthetic import LABEL_NAMES, make_synthetic_slides, write_slide_file
from vmamba2d.runs import RunFolder, RunFolderBusy, RunFolderError, RunFolderLock
from vmamba2d.runs.run_lock import LOCK_NAME


pytestmark = pytest.mark.usefixtures("one_thread_module")  # one intra-op thread: reproducible, and fast on 2 cores


@pytest.mark.slow
def test_a_second_process_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path):
    folder = tmp_path / "run"
    with lock_held_by_another_process(folder) as holder:
        with pytest.raises(RunFolderBusy) as refused:
            RunFolderLock(folder).acquire()
        message = str(refused.value)
        assert "\n" not in message
        assert str(folder) in message and f"process {holder.pid}" in message
    # the holder was killed with SIGKILL: no cleanup ran, the kernel dropped the lock
    with RunFolderLock(folder) as lock:
        assert lock.path.read_text() == f"{__import__('os').getpid()}\n"
        with pytest.raises(RunFolderBusy):  # a second lock of the same process is refused too
            RunFolderLock(folder).acquire()


def test_a_folder_created_for_the_lock_is_removed_when_nothing_was_written(tmp_path):
    nested = tmp_path / "a" / "b" / "run"
    with RunFolderLock(nested):
        assert (nested / LOCK_NAME).is_file()
    assert not (tmp_path / "a").exists()
    kept = tmp_path / "kept"
    with RunFolderLock(kept):
        (kept / "log.txt").write_text("x")
    assert sorted(p.name for p in kept.iterdir()) == ["log.txt"]
    existing = tmp_path / "existing"
    existing.mkdir()
    with RunFolderLock(existing):
        pass
    assert existing.is_dir() and not any(existing.iterdir())


def test_a_file_in_the_way_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match=r"^--work-dir .*file: a file is in the way"):
        RunFolderLock(tmp_path / "file", "--work-dir").acquire()
    with pytest.raises(RunFolderError, match="cannot be created"):
        RunFolderLock(tmp_path / "file" / "run").acquire()


def test_the_lock_file_does_not_make_a_folder_non_empty(tmp_path):
    with RunFolderLock(tmp_path / "run"):
        plan = RunFolder(tmp_path / "run", script="tests/x.py").plan_start(None)
    assert plan.resume_from is None and not plan.continues


def _one_line_refusal(capsys, folder: Path, pid: int) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "error:" in err[0] and str(folder) in err[0] and f"process {pid}" in err[0], err[0]


@pytest.mark.slow
def test_classification_train_refuses_a_locked_output(tmp_path, capsys):
    data = make_tiny_imagefolder(tmp_path / "data", train_per_class=2, val_per_class=1)
    output = tmp_path / "run"
    argv = ["--model", "test_convnext", "--data-dir", str(data), "--output", str(output),
            "--epochs", "1", "--img-size", "32", "--batch-size", "2", "--warmup-epochs", "0",
            "--device", "cpu", "--no-progress",
            "--resume", "auto"]
    with lock_held_by_another_process(output) as holder:
        assert train_cli.main(argv) == 2
        _one_line_refusal(capsys, output, holder.pid)
        assert [p.name for p in output.iterdir()] == [LOCK_NAME]  # nothing of this run written


@pytest.mark.slow
def test_mil_train_refuses_a_locked_output(tmp_path, capsys):
    features = tmp_path / "features"
    features.mkdir()
    rows = ["slide_id,label,split"]
    for index, split in enumerate(("train", "val", "test")):
        for slide in make_synthetic_slides(2, min_size=12, max_size=12, in_dim=8, seed=index,
                                           prefix=split):
            write_slide_file(slide, features, "pt")
            rows.append(f"{slide.slide_id},{LABEL_NAMES[slide.label]},{split}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    output = tmp_path / "run"
    argv = ["--feature-dir", str(features), "--label-csv", str(tmp_path / "labels.csv"),
            "--label-map", "negative=0", "positive=1", "--output", str(output), "--epochs", "1",
            "--device", "cpu", "--no-progress", "--resume"]
    with lock_held_by_another_process(output) as holder:
        assert mil_train_main(argv) == 2
        _one_line_refusal(capsys, output, holder.pid)
        assert [p.name for p in output.iterdir()] == [LOCK_NAME]
