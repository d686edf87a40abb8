"""Crash-safe segmentation runs: atomic mmengine checkpoints, commit order, start / resume / repair rules
of seg/train.py (vmamba2d.openmmlab.safe_checkpoints, vmamba2d.openmmlab.work_dir)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mmseg", reason="the seg extra (mmsegmentation, mmengine, mmcv) is not installed")

import vmamba2d.seg  # noqa: E402,F401  (registers the hook, the atomic backend and the weights_only allow-list)
from mmengine.config import Config  # noqa: E402
from support.seg_runs import TINY_CONFIG, load_seg_script, run_options  # noqa: E402
from vmamba2d.openmmlab import safe_checkpoints  # noqa: E402
from vmamba2d.openmmlab.safe_checkpoints import AtomicLocalBackend  # noqa: E402
from vmamba2d.openmmlab.work_dir import UnreadableCheckpoint, prepare_work_dir  # noqa: E402
from vmamba2d.runs import RunFolderError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# Kills (os._exit, as SIGKILL: no cleanup) in a child process, at two moments:
# "mid_write": half-way through writing iter_4.pth (iteration 2 committed);
# "first_commit": right before the first last_checkpoint is written (best_mIoU_iter_2.pth and
# iter_2.pth on disk, nothing committed).
# Bitwise comparisons across processes need the same intra-op thread count on both sides
# (CPU reductions are split by thread): the children and this process all run with THREADS.
THREADS = 1
_KILLED_RUN = """
import json, os, runpy, sys
from pathlib import Path
import torch
torch.set_num_threads({threads})
sys.path.insert(0, {root!r})
import vmamba2d.seg
from vmamba2d.openmmlab import safe_checkpoints
from vmamba2d.openmmlab.safe_checkpoints import AtomicLocalBackend
from vmamba2d.runs.checkpoint import temp_path_for

write = AtomicLocalBackend.put
def dying_put(self, obj, filepath):
    if Path(filepath).name == "iter_4.pth":
        with open(temp_path_for(Path(filepath)), "wb") as handle:
            handle.write(obj[: len(obj) // 2])
        os._exit(137)
    write(self, obj, filepath)
def dying_commit(work_dir, checkpoint_path):
    os._exit(137)
if {moment!r} == "mid_write":
    AtomicLocalBackend.put = dying_put
else:
    safe_checkpoints.write_last_checkpoint = dying_commit
sys.argv = ["seg/train.py", *json.loads(sys.argv[1])]
runpy.run_path({train!r}, run_name="__main__")
"""


def _start_killed_run(tmp_path: Path, moment: str, options: list) -> tuple:
    """(work dir, child process, log file) of a training run in a child that dies at ``moment``."""
    work = tmp_path / f"killed_{moment}"
    argv = [str(TINY_CONFIG), "--work-dir", str(work), "--cfg-options", *options]
    script = tmp_path / f"killed_run_{moment}.py"
    script.write_text(_KILLED_RUN.format(root=str(ROOT), train=str(ROOT / "seg" / "train.py"),
                                         threads=THREADS, moment=moment))
    log_path = tmp_path / f"killed_run_{moment}.log"
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, str(script), json.dumps(argv)], cwd=tmp_path,
                                 stdout=log, stderr=subprocess.STDOUT)
    return work, child, log_path


def _assert_same_weights(checkpoint: Path, reference: Path) -> dict:
    """Bitwise-equal state dicts; returns the loaded ``checkpoint``."""
    resumed = torch.load(checkpoint, weights_only=True)
    expected = torch.load(reference, weights_only=True)
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=0, msg=name)
    return resumed


def _deterministic_options(data_root: Path) -> list:
    """4 iterations, checkpoint + validation every 2, keep 1 checkpoint; the config's drop-path (0.2)
    and dropout (0.1) draw from the torch generator, which the hook checkpoints."""
    return run_options(data_root, max_iters=4) + [
        "default_hooks.checkpoint.max_keep_ckpts=1",
        "optim_wrapper.optimizer.lr=0.001",  # updates far above float32 rounding, so a wrong resume shows
        "param_scheduler.0.start_factor=1.0",
    ]


def _scalar_steps(work_dir: Path, key: str) -> list:
    steps = []
    for path in sorted(work_dir.glob("*/vis_data/scalars.json")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if key in record:
                steps.append(record["step"])
    return sorted(steps)


def _train_reference(train, options: list, reference: Path, monkeypatch) -> None:
    """The uninterrupted run; checks the order of its checkpoint writes, commits and deletions."""
    events = []
    put, remove = AtomicLocalBackend.put, AtomicLocalBackend.remove
    monkeypatch.setattr(AtomicLocalBackend, "put", lambda self, obj, path: (
        events.append(("write", Path(path).name)), put(self, obj, path))[1])
    monkeypatch.setattr(AtomicLocalBackend, "remove", lambda self, path: (
        events.append(("remove", Path(path).name)), remove(self, path))[1])
    commit = safe_checkpoints.write_last_checkpoint
    monkeypatch.setattr(safe_checkpoints, "write_last_checkpoint", lambda work_dir, path: (
        events.append(("commit", Path(path).name)), commit(work_dir, path))[1])
    # each in-process run gets its own visualizer (mmengine keeps one global instance per name)
    train.train([str(TINY_CONFIG), "--work-dir", str(reference), "--cfg-options", *options,
                 "visualizer.name=reference"])
    monkeypatch.undo()
    # validation (and best) before the iteration's checkpoint, last_checkpoint after it, deletions last
    improved = ("write", "best_mIoU_iter_4.pth") in events  # the first validation always sets a best
    assert events == [("write", "best_mIoU_iter_2.pth"), ("write", "iter_2.pth"), ("commit", "iter_2.pth"),
                      *([("write", "best_mIoU_iter_4.pth")] if improved else []),
                      ("write", "iter_4.pth"), ("commit", "iter_4.pth"), ("remove", "iter_2.pth"),
                      *([("remove", "best_mIoU_iter_2.pth")] if improved else [])]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_kills_during_checkpoint_writes_then_resume_equal_the_uninterrupted_run(ade_root, tmp_path, monkeypatch):
    train = load_seg_script("train")
    options = _deterministic_options(ade_root)
    # the killed runs in child processes, running while this process trains the reference
    killed = {moment: _start_killed_run(tmp_path, moment, options) for moment in ("mid_write", "first_commit")}
    reference = tmp_path / "reference"
    try:
        _train_reference(train, options, reference, monkeypatch)
    finally:
        for _, child, _ in killed.values():
            child.wait(timeout=300)
    for work, child, log_path in killed.values():
        assert child.returncode == 137, log_path.read_text()[-3000:]

    # killed mid-write of iter_4.pth: the committed iteration 2, a half-written temp file, and files
    # ahead of the commit
    work = killed["mid_write"][0]
    assert (work / "last_checkpoint").read_text() == str(work / "iter_2.pth")
    assert not (work / "iter_4.pth").exists()
    assert (work / "iter_2.pth").is_file() and (work / "best_mIoU_iter_2.pth").is_file()  # deleted only after a commit
    assert [p.name for p in work.glob(".iter_4.pth.tmp-*")], sorted(p.name for p in work.iterdir())
    assert 4 in _scalar_steps(work, "loss")
    committed = torch.load(work / "iter_2.pth", weights_only=True)["state_dict"]

    train.train([str(TINY_CONFIG), "--work-dir", str(work), "--resume", "--cfg-options", *options,
                 "visualizer.name=resumed"])
    assert not list(work.glob(".*.tmp-*"))
    assert (work / "last_checkpoint").read_text() == str(work / "iter_4.pth")
    assert sorted(p.name for p in work.glob("*.pth")) == sorted(p.name for p in reference.glob("*.pth"))
    resumed = _assert_same_weights(work / "iter_4.pth", reference / "iter_4.pth")
    assert resumed["meta"]["iter"] == 4
    moved = max((resumed["state_dict"][name] - committed[name]).abs().max().item() for name in committed)
    assert moved > 1e-4  # iterations 3 and 4 did train after the resume
    # the best checkpoint named by the last checkpoint exists (never behind it); no other best is left
    best = Path(resumed["message_hub"]["runtime_info"]["best_ckpt"])
    assert best.is_file() and [p.name for p in work.glob("best_*.pth")] == [best.name]
    # scalar logs: each training step once across the killed and the resumed run
    assert _scalar_steps(work, "loss") == [1, 2, 3, 4]
    assert _scalar_steps(work, "mIoU") == [2, 4]

    # killed before the first commit: checkpoints of iteration 2, no last_checkpoint; --resume starts over
    work = killed["first_commit"][0]
    assert not (work / "last_checkpoint").exists()
    assert (work / "iter_2.pth").is_file() and (work / "best_mIoU_iter_2.pth").is_file()
    train.train([str(TINY_CONFIG), "--work-dir", str(work), "--resume", "--cfg-options", *options,
                 "visualizer.name=restarted"])
    assert (work / "last_checkpoint").read_text() == str(work / "iter_4.pth")
    assert sorted(p.name for p in work.glob("*.pth")) == sorted(p.name for p in reference.glob("*.pth"))
    restarted = _assert_same_weights(work / "iter_4.pth", reference / "iter_4.pth")
    assert Path(restarted["message_hub"]["runtime_info"]["best_ckpt"]).is_file()
    assert _scalar_steps(work, "loss") == [1, 2, 3, 4]
    assert _scalar_steps(work, "mIoU") == [2, 4]


def _fake_checkpoint(path: Path, iteration: int, experiment_name: str = "tiny_20261122_200000",
                     **runtime_info) -> Path:
    """An mmengine-shaped training checkpoint (meta, state_dict, message hub)."""
    torch.save({"meta": {"iter": iteration, "epoch": 0, "experiment_name": experiment_name},
                "state_dict": {"w": torch.full((64,), float(iteration))},
                "message_hub": {"runtime_info": runtime_info, "log_scalars": {}}}, path)
    return path


def _cfg(work_dir: Path) -> Config:
    return Config(dict(work_dir=str(work_dir), default_hooks=dict(
        checkpoint=dict(type="CheckpointHook", by_epoch=False, interval=2, save_best="mIoU"))))


def _committed_folder(folder: Path) -> Path:
    """iter_2 committed (with its best), iter_4 + best of iter 4 written after the commit, scalar
    logs up to step 4, a temp file of a killed write."""
    folder.mkdir()
    best_2 = folder / "best_mIoU_iter_2.pth"
    _fake_checkpoint(best_2, 2)
    _fake_checkpoint(folder / "iter_2.pth", 2, best_ckpt=str(best_2))
    _fake_checkpoint(folder / "iter_4.pth", 4)
    _fake_checkpoint(folder / "best_mIoU_iter_4.pth", 4)
    (folder / "last_checkpoint").write_text(str(folder / "iter_2.pth"))
    (folder / ".iter_6.pth.tmp-12345").write_bytes(b"partial")
    logs = folder / "20261122_210000" / "vis_data"
    logs.mkdir(parents=True)
    (logs / "scalars.json").write_text("".join(json.dumps({"loss": 1.0, "step": s}) + "\n" for s in (1, 2, 3, 4))
                                       + '{"loss": 0.')  # torn last line
    return folder


def test_resume_repairs_what_a_kill_left_ahead_of_the_commit(tmp_path):
    work = _committed_folder(tmp_path / "work")
    cfg = _cfg(work)
    notes = prepare_work_dir(cfg, "auto")
    assert cfg.resume is True and cfg.load_from == str(work / "iter_2.pth")
    assert cfg.default_hooks.checkpoint.type == "AtomicCheckpointHook"
    assert sorted(p.name for p in work.iterdir()) == [
        "20261122_210000", "best_mIoU_iter_2.pth", "iter_2.pth", "last_checkpoint"]
    lines = (work / "20261122_210000" / "vis_data" / "scalars.json").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert any(".iter_6.pth.tmp-12345" in note for note in notes)
    assert any("iter_4.pth" in note for note in notes)
    assert prepare_work_dir(_cfg(work), "auto") == []  # repaired: idempotent


def test_truncated_or_corrupted_latest_checkpoint_is_reported_and_skipped(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    _fake_checkpoint(work / "iter_2.pth", 2)
    latest = _fake_checkpoint(work / "iter_4.pth", 4)
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 2])  # what plain mmengine leaves after a kill mid-write
    (work / "last_checkpoint").write_text(str(latest))

    with pytest.raises(UnreadableCheckpoint, match=r"iter_4\.pth \(\d+ bytes\) is not a complete torch checkpoint"):
        prepare_work_dir(_cfg(work), str(latest))
    cfg = _cfg(work)
    notes = prepare_work_dir(cfg, "auto")
    assert cfg.load_from == str(work / "iter_2.pth")
    assert any(note.startswith("the latest checkpoint is unusable") and "iter_4.pth" in note and "truncated" in note
               for note in notes)
    assert (work / "last_checkpoint").read_text() == str(work / "iter_2.pth")
    # set aside, not deleted: renamed, with its bytes, and reported
    (aside,) = work.glob("iter_4.pth.corrupt-*")
    assert not latest.exists() and aside.read_bytes() == data[: len(data) // 2]
    assert any(f"aside as {aside.name}" in note for note in notes)

    # a flipped byte in the tensor data: the archive's CRC check names the member
    only = work / "iter_2.pth"
    data = bytearray(only.read_bytes())
    position = data.find(bytes(torch.full((64,), 2.0).numpy().tobytes()[:16]))
    assert position > 0
    data[position] ^= 0xFF
    only.write_bytes(bytes(data))
    with pytest.raises(UnreadableCheckpoint, match="no readable checkpoint.*iter_2.pth is corrupted.*CRC"):
        prepare_work_dir(_cfg(work), "auto")
    (work / "empty.pth").write_bytes(b"")
    with pytest.raises(UnreadableCheckpoint, match=r"empty\.pth \(0 bytes\)"):
        prepare_work_dir(_cfg(work), str(work / "empty.pth"))


def test_an_intact_checkpoint_refused_by_the_allow_list_stops_the_resume_and_is_kept(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    _fake_checkpoint(work / "iter_2.pth", 2)
    latest = work / "iter_4.pth"
    torch.save({"meta": {"iter": 4, "epoch": 0, "experiment_name": "tiny_20261122_200000",
                         "cfg_path": Path("/configs/tiny.py")},  # a PosixPath: outside the allow-list
                "state_dict": {"w": torch.zeros(64)}, "message_hub": {}}, latest)
    saved = latest.read_bytes()
    (work / "last_checkpoint").write_text(str(latest))
    with pytest.raises(UnreadableCheckpoint) as refused:
        prepare_work_dir(_cfg(work), "auto")
    message = str(refused.value)
    assert "\n" not in message and "iter_4.pth is intact but weights-only loading refuses it" in message
    assert "PosixPath" in message and "If you trust it" in message
    assert latest.read_bytes() == saved and (work / "last_checkpoint").read_text() == str(latest)
    assert sorted(p.name for p in work.iterdir()) == ["iter_2.pth", "iter_4.pth", "last_checkpoint"]


def test_moved_work_dir_resumes_from_its_own_copy_of_the_latest_checkpoint(tmp_path):
    work = tmp_path / "moved"
    work.mkdir()
    _fake_checkpoint(work / "iter_2.pth", 2)
    _fake_checkpoint(work / "iter_4.pth", 4)
    (work / "last_checkpoint").write_text(str(tmp_path / "old_place" / "iter_4.pth"))
    cfg = _cfg(work)
    notes = prepare_work_dir(cfg, "auto")
    assert cfg.load_from == str(work / "iter_4.pth") and (work / "iter_4.pth").is_file()
    assert any("does not exist" in note for note in notes)
    assert (work / "last_checkpoint").read_text() == str(work / "iter_4.pth")


def test_work_dir_start_rules(tmp_path):
    committed = _committed_folder(tmp_path / "run")
    with pytest.raises(RunFolderError, match="already holds a training run.*--resume"):
        prepare_work_dir(_cfg(committed), None)
    other = _fake_checkpoint(tmp_path / "elsewhere.pth", 8)
    with pytest.raises(RunFolderError, match="already holds another run.*overwrite"):
        prepare_work_dir(_cfg(committed), str(other))

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    (foreign / "20261122_210000").mkdir()
    with pytest.raises(RunFolderError, match=r"foreign has no last_checkpoint.*not empty \(notes\.txt\)"):
        prepare_work_dir(_cfg(foreign), "auto")
    assert (foreign / "notes.txt").exists()

    # a run that never committed a checkpoint: its log folder and config copy only -> start over
    fresh = tmp_path / "uncommitted"
    (fresh / "20261122_210000").mkdir(parents=True)
    (fresh / "config.py").write_text("model = None\n")
    (fresh / ".iter_2.pth.tmp-999").write_bytes(b"x")
    cfg = _cfg(fresh)
    prepare_work_dir(cfg, "auto")
    assert cfg.resume is False and cfg.load_from is None
    assert not (fresh / ".iter_2.pth.tmp-999").exists()
    cfg = _cfg(fresh)
    prepare_work_dir(cfg, str(other))  # a checkpoint from elsewhere into a never-committed folder
    assert cfg.resume is True and cfg.load_from == str(other)


def _killed_before_first_commit(folder: Path) -> Path:
    """What a kill between the first checkpoint writes and the first commit leaves: the run's log folder
    (scalars of steps 1 and 2), config copy, best and iter_2 checkpoints, a temp file, no last_checkpoint."""
    logs = folder / "20261122_210000" / "vis_data"
    logs.mkdir(parents=True)
    (logs / "scalars.json").write_text("".join(json.dumps({"loss": 1.0, "step": s}) + "\n" for s in (1, 2)))
    (folder / "tiny.py").write_text("model = None\n")
    best = _fake_checkpoint(folder / "best_mIoU_iter_2.pth", 2, experiment_name="tiny_20261122_210000")
    _fake_checkpoint(folder / "iter_2.pth", 2, experiment_name="tiny_20261122_210000", best_ckpt=str(best))
    (folder / ".last_checkpoint.tmp-4242").write_bytes(b"/x/iter_")
    return folder


def test_resume_starts_over_after_a_kill_before_the_first_commit(tmp_path):
    work = _killed_before_first_commit(tmp_path / "work")
    cfg = _cfg(work)
    notes = prepare_work_dir(cfg, "auto")
    assert cfg.resume is False and cfg.load_from is None
    assert sorted(p.name for p in work.iterdir()) == ["20261122_210000", "tiny.py"]
    assert (work / "20261122_210000" / "vis_data" / "scalars.json").read_text() == ""  # every step runs again
    for name in ("best_mIoU_iter_2.pth", "iter_2.pth"):
        assert any(note.startswith(f"removed {name}: written by a run killed before its first commit")
                   for note in notes), notes
    assert prepare_work_dir(_cfg(work), "auto") == [f"{work}: no committed checkpoint yet, starting from scratch"]

    # --resume PATH from elsewhere into such a folder: the uncommitted files go too
    work = _killed_before_first_commit(tmp_path / "path")
    other = _fake_checkpoint(tmp_path / "elsewhere.pth", 8)
    cfg = _cfg(work)
    prepare_work_dir(cfg, str(other))
    assert cfg.resume is True and cfg.load_from == str(other)
    assert sorted(p.name for p in work.iterdir()) == ["20261122_210000", "tiny.py"]


def test_other_ranks_start_over_while_rank_0_deletes_the_uncommitted_checkpoints(tmp_path, monkeypatch):
    from vmamba2d.openmmlab import work_dir as work_dir_module

    work = _killed_before_first_commit(tmp_path / "work")
    read = work_dir_module.read_checkpoint_state

    def read_after_rank_0_deleted(path):
        Path(path).unlink()  # rank 0 removed it between this rank's listing and its read
        return read(path)

    monkeypatch.setattr(work_dir_module, "read_checkpoint_state", read_after_rank_0_deleted)
    monkeypatch.setenv("RANK", "1")
    cfg = _cfg(work)
    assert prepare_work_dir(cfg, "auto") == [f"{work}: no committed checkpoint yet, starting from scratch"]
    assert cfg.resume is False and cfg.load_from is None
    assert (work / "20261122_210000" / "vis_data" / "scalars.json").read_text() != ""  # rank 0's job


def test_checkpoints_of_another_run_in_an_uncommitted_folder_are_refused_and_kept(tmp_path):
    # another experiment's checkpoint (its timestamp has no log folder here) and an unreadable one
    work = _killed_before_first_commit(tmp_path / "work")
    _fake_checkpoint(work / "iter_6.pth", 6, experiment_name="other_20250101_000000")
    (work / "best_mIoU_iter_8.pth").write_bytes(b"not a checkpoint")
    before = sorted(p.name for p in work.iterdir() if not p.name.startswith("."))
    refused = (r"no last_checkpoint.*not empty \(best_mIoU_iter_8\.pth \(unreadable\), "
               r"iter_6\.pth \(of run 20250101_000000, which left no log folder here\)\)")
    with pytest.raises(RunFolderError, match=refused):
        prepare_work_dir(_cfg(work), "auto")
    assert sorted(p.name for p in work.iterdir() if not p.name.startswith(".")) == before

    # checkpoints without any log folder of the run that wrote them (copied in by hand)
    bare = tmp_path / "bare"
    bare.mkdir()
    _fake_checkpoint(bare / "iter_2.pth", 2, experiment_name="tiny_20261122_210000")
    with pytest.raises(RunFolderError, match=r"iter_2\.pth \(of run 20261122_210000"):
        prepare_work_dir(_cfg(bare), "auto")
    assert (bare / "iter_2.pth").is_file()


def test_atomic_backend_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "iter_2.pth"
    backend = AtomicLocalBackend()
    backend.put(b"complete checkpoint", target)
    assert target.read_bytes() == b"complete checkpoint"

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        backend.put(b"new bytes that never land", target)
    assert target.read_bytes() == b"complete checkpoint"
    assert sorted(p.name for p in target.parent.iterdir()) == ["iter_2.pth"]


@pytest.mark.slow
def test_a_second_run_into_a_locked_work_dir_is_refused_in_one_line(ade_root, tmp_path, capsys):
    from support.run_lock_holder import lock_held_by_another_process
    from vmamba2d.runs.run_lock import LOCK_NAME

    work = tmp_path / "work"
    argv = [str(TINY_CONFIG), "--work-dir", str(work), "--resume", "--cfg-options",
            *run_options(ade_root, max_iters=2)]
    with lock_held_by_another_process(work) as holder:
        assert load_seg_script("train").main(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("train.py: error: --work-dir") and str(work) in line
        assert f"process {holder.pid}" in line
        assert [p.name for p in work.iterdir()] == [LOCK_NAME]  # no log folder, no config copy


def test_a_legacy_non_zip_checkpoint_is_read_not_called_truncated(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    legacy = work / "iter_2.pth"
    torch.save({"meta": {"iter": 2, "epoch": 0, "experiment_name": "tiny_20261122_200000"},
                "state_dict": {"w": torch.zeros(4)}, "message_hub": {}}, legacy,
               _use_new_zipfile_serialization=False)
    (work / "last_checkpoint").write_text(str(legacy))
    cfg = _cfg(work)
    prepare_work_dir(cfg, "auto")
    assert cfg.resume is True and cfg.load_from == str(legacy)
    data = legacy.read_bytes()
    legacy.write_bytes(data[: len(data) // 2])
    with pytest.raises(UnreadableCheckpoint, match=r"is a legacy \(non-zip\) torch file that cannot be read"):
        prepare_work_dir(_cfg(work), str(legacy))
