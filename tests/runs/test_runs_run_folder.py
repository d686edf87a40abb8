"""vmamba2d.runs.run_folder: hard kills between every write of a commit, then repair.

A kill is simulated in a forked child: every os.replace / os.fsync / os.unlink call (each file
write of the protocol is followed by one of them) counts as a step, and the child dies with
os._exit before step k, so no ``finally`` block and no buffered write runs, as with SIGKILL.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch

from vmamba2d.runs import RunFolder, RunFolderError
from vmamba2d.runs.checkpoint import remove_stale_temp_files
from vmamba2d.runs.run_folder import StartPlan

SCRIPT = "tests/train.py"
PROTOCOL_FILES = {"last.pth", "best.pth", "metrics.jsonl", "run.json"}
KILLED, FINISHED, FAILED = 37, 38, 39

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def last_checkpoint(epochs_done: int, best_epoch: int) -> dict:
    return {"epoch": epochs_done, "best_epoch": best_epoch,
            "weights": torch.full((4,), float(epochs_done))}


def best_checkpoint(epoch: int) -> dict:
    return {"epoch": epoch, "weights": torch.full((4,), 100.0 + epoch)}


def epoch_record(epoch: int) -> dict:
    return {"type": "epoch", "loss": 1.0 / (epoch + 1)}


def commit_epoch(run: RunFolder, epoch: int, best_epoch: int) -> None:
    """Commit ``epoch``; it is a new best when ``best_epoch == epoch``."""
    run.commit(epoch=epoch, checkpoint=last_checkpoint(epoch + 1, best_epoch),
               records=[epoch_record(epoch)],
               best=best_checkpoint(epoch) if best_epoch == epoch else None)


def run_killed_at(step: int, action: Callable[[], None]) -> int:
    """Run ``action`` in a forked child that dies just before its ``step``-th file-system step;
    returns KILLED, or FINISHED when the action took fewer steps."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            counter = [0]

            def dying(original):
                def call(*args, **kwargs):
                    if counter[0] == step:
                        os._exit(KILLED)
                    counter[0] += 1
                    return original(*args, **kwargs)
                return call

            for name in ("replace", "fsync", "unlink"):
                setattr(os, name, dying(getattr(os, name)))
            action()
            os._exit(FINISHED)
        except BaseException:  # noqa: BLE001 - the child must never return into pytest
            os._exit(FAILED)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (KILLED, FINISHED), f"child failed (exit {code}) at step {step}"
    return code


def committed_epochs(run: RunFolder) -> int:
    if not run.last_path.exists():
        return 0
    return torch.load(run.last_path, weights_only=True)["epoch"]


def assert_consistent(run: RunFolder, best_of: dict[int, int]) -> int:
    """The folder after a start: metrics and best.pth match last.pth exactly, no leftovers.

    ``best_of[n]``: the best epoch recorded after n committed epochs."""
    epochs = committed_epochs(run)
    names = {p.name for p in run.path.iterdir()}
    if epochs:
        assert names == PROTOCOL_FILES
    else:
        assert "run.json" in names and names <= {"run.json", "metrics.jsonl"}
    records = run.records()
    assert [r["epoch"] for r in records] == list(range(epochs))
    assert records == [{"epoch": e, **epoch_record(e)} for e in range(epochs)]
    if epochs:
        last = torch.load(run.last_path, weights_only=True)
        assert last["best_epoch"] == best_of[epochs]
        best = torch.load(run.best_path, weights_only=True)
        assert best["epoch"] == best_of[epochs]
        torch.testing.assert_close(best["weights"], best_checkpoint(best_of[epochs])["weights"])
    else:
        assert not run.best_path.exists()
    return epochs


def make_run(folder: Path, epochs: int, best_epochs: list[int]) -> RunFolder:
    run = RunFolder(folder, script=SCRIPT)
    run.start(run.plan_start(None), 0)
    for epoch in range(epochs):
        commit_epoch(run, epoch, best_epochs[epoch])
    return run


def resume(folder: Path) -> RunFolder:
    """What a training script does on ``--resume auto``: plan, then start (= repair)."""
    run = RunFolder(folder, script=SCRIPT)
    plan = run.plan_start("auto")
    run.start(plan, committed_epochs(run) if plan.continues else 0)
    return run


def no_hard_links(monkeypatch) -> None:
    """Make os.link fail as on a file system without hard links (e.g. FAT)."""
    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "link", refuse)


# best epoch after each commit: epoch 0 best, epoch 1 not, epoch 2 best (improved) / not
@pytest.mark.parametrize("third_is_best, hard_links", [(True, True), (False, True),
                                                      (True, False)])
def test_kill_before_every_step_of_a_commit_is_repaired_on_resume(tmp_path, monkeypatch,
                                                                  third_is_best, hard_links):
    template = make_run(tmp_path / "template", 2, [0, 0]).path
    if not hard_links:
        no_hard_links(monkeypatch)
    best_of = {1: 0, 2: 0, 3: 2 if third_is_best else 0}
    outcomes = []
    for step in range(100):
        folder = tmp_path / f"kill{step}"
        shutil.copytree(template, folder)
        run = RunFolder(folder, script=SCRIPT)
        outcome = run_killed_at(step, lambda: commit_epoch(run, 2, best_of[3]))
        # before any repair, best.pth is there, complete: the old one or the new one
        best = torch.load(run.best_path, weights_only=True)
        assert best["epoch"] in {0, best_of[3]}, step
        torch.testing.assert_close(best["weights"], best_checkpoint(best["epoch"])["weights"])
        left = {p.name for p in folder.iterdir()} - PROTOCOL_FILES
        outcomes.append((committed_epochs(run), outcome))
        resumed = resume(folder)
        epochs = assert_consistent(resumed, best_of)
        assert resumed.repair(epochs) == []  # nothing left to repair
        if outcome == FINISHED:
            assert not left and epochs == 3
            break
    else:
        pytest.fail("the commit never finished")
    # the commit point is the replace of last.pth: killed before it -> 2 epochs, after -> 3
    assert [epochs for epochs, _ in outcomes] == sorted(epochs for epochs, _ in outcomes)
    assert {epochs for epochs, _ in outcomes} == {2, 3}
    # kill points: (staging, best.pth write,) metrics append, last.pth write (, cleanup)
    assert len(outcomes) >= (10 if third_is_best else 4)


def test_kill_during_the_first_commit_restarts_the_run(tmp_path):
    template = make_run(tmp_path / "template", 0, []).path
    for step in range(100):
        folder = tmp_path / f"kill{step}"
        shutil.copytree(template, folder)
        run = RunFolder(folder, script=SCRIPT)
        outcome = run_killed_at(step, lambda: commit_epoch(run, 0, 0))
        plan = RunFolder(folder, script=SCRIPT).plan_start("auto")
        assert plan.continues == run.last_path.exists()
        if not plan.continues:
            assert plan.resume_from is None and "never finished its first epoch" in plan.notes[0]
        assert_consistent(resume(folder), {1: 0})
        if outcome == FINISHED:
            break


@pytest.mark.slow
def test_kill_during_repair_is_repaired_by_the_next_start(tmp_path):
    """Kill a commit at every step, then kill the repair at every step: the next start still
    ends consistent (repair is idempotent)."""
    template = make_run(tmp_path / "template", 2, [0, 1]).path
    best_of = {1: 0, 2: 1, 3: 2}
    checked = 0
    for commit_step in range(100):
        killed = tmp_path / f"commit{commit_step}"
        shutil.copytree(template, killed)
        run = RunFolder(killed, script=SCRIPT)
        if run_killed_at(commit_step, lambda: commit_epoch(run, 2, 2)) == FINISHED:
            break
        for repair_step in range(100):
            folder = tmp_path / f"commit{commit_step}-repair{repair_step}"
            shutil.copytree(killed, folder)
            outcome = run_killed_at(repair_step, lambda: resume(folder))
            assert_consistent(resume(folder), best_of)
            checked += 1
            if outcome == FINISHED:
                break
    assert checked > 10


def test_temp_files_of_killed_writes_are_removed_on_start(tmp_path):
    run = make_run(tmp_path / "run", 1, [0])
    stale = [run.path / ".last.pth.tmp-4242", run.path / ".metrics.jsonl.tmp-7"]
    for path in stale:
        path.write_bytes(b"partial")
    keep = run.path / ".notes.tmp-x"  # not a temp-file name of ours
    keep.write_text("mine")
    notes = RunFolder(run.path, script=SCRIPT).start(StartPlan(run.last_path, True), 1)
    assert not any(path.exists() for path in stale) and keep.exists()
    assert sum("temporary file" in note for note in notes) == 2
    assert remove_stale_temp_files(run.path) == []


def test_torn_metrics_line_is_dropped(tmp_path):
    run = make_run(tmp_path / "run", 2, [0, 1])
    with open(run.metrics_path, "a") as handle:
        handle.write('{"epoch": 2, "type": "ep')  # killed mid-append
    notes = run.repair(2)
    assert any("torn" in note for note in notes)
    assert [r["epoch"] for r in run.records()] == [0, 1]
    assert run.metrics_path.read_text().endswith("}\n")


# ---------------------------------------------------------------- start rules -------------

def test_fresh_start_needs_an_absent_or_empty_folder(tmp_path):
    assert RunFolder(tmp_path / "new", script=SCRIPT).plan_start(None) == StartPlan(None, False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".run.json.tmp-123").write_text("{")  # killed while starting
    empty = RunFolder(tmp_path / "empty", script=SCRIPT)
    assert empty.plan_start(None).resume_from is None
    assert empty.plan_start("auto").resume_from is None
    empty.start(empty.plan_start(None), 0)
    assert [p.name for p in empty.path.iterdir()] == ["run.json"]
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    with pytest.raises(RunFolderError, match=r"--output .*busy is not empty \(notes.txt\)"):
        RunFolder(busy, script=SCRIPT).plan_start(None)
    run = make_run(tmp_path / "run", 1, [0])
    with pytest.raises(RunFolderError, match="already holds a training run.*--resume auto"):
        RunFolder(run.path, script=SCRIPT).plan_start(None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="not a folder"):
        RunFolder(tmp_path / "file", script=SCRIPT).plan_start("auto")


def test_resume_auto_refuses_a_non_empty_folder_without_last(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("notes.txt", "best.pth"):
        (folder / name).write_text("x")
    (folder / "logs").mkdir()
    with pytest.raises(RunFolderError) as error:
        RunFolder(folder, script=SCRIPT, output_option="--work-dir").plan_start("auto")
    message = str(error.value)
    for fragment in (str(folder), "no last.pth", "best.pth, logs/, notes.txt", "--work-dir",
                     "--resume auto"):
        assert fragment in message
    assert sorted(p.name for p in folder.iterdir()) == ["best.pth", "logs", "notes.txt"]


def test_resume_auto_refuses_a_run_whose_last_was_deleted(tmp_path):
    run = make_run(tmp_path / "run", 3, [0, 1, 1])
    run.last_path.unlink()  # e.g. removed by hand: best.pth and metrics prove commits
    with pytest.raises(RunFolderError, match="best.pth shows that epochs were committed"):
        RunFolder(run.path, script=SCRIPT).plan_start("auto")
    run.best_path.unlink()
    with pytest.raises(RunFolderError, match="metrics.jsonl shows that epochs were committed"):
        RunFolder(run.path, script=SCRIPT).plan_start("auto")
    with pytest.raises(RunFolderError, match="'tests/train.py', not 'other.py'"):
        RunFolder(run.path, script="other.py").plan_start("auto")


def test_explicit_resume_rules(tmp_path):
    source = make_run(tmp_path / "source", 2, [0, 1])
    target = RunFolder(tmp_path / "target", script=SCRIPT)
    plan = target.plan_start(str(source.last_path))
    assert plan == StartPlan(source.last_path, False)
    target.start(plan, 0)
    assert json.loads(target.marker_path.read_text())["started_from"] == str(source.last_path)
    # the first commit in target is killed: --resume auto restarts from the same checkpoint
    with open(target.metrics_path, "a") as handle:
        handle.write(json.dumps({"epoch": 2, "type": "epoch"}) + "\n")
    assert target.plan_start("auto").resume_from == source.last_path
    # once target has its own last.pth, another checkpoint would overwrite it
    commit_epoch(RunFolder(target.path, script=SCRIPT), 2, 2)
    with pytest.raises(RunFolderError, match="would overwrite"):
        target.plan_start(str(source.last_path))
    assert target.plan_start(str(target.last_path)).continues
    with pytest.raises(RunFolderError, match="checkpoint not found"):
        target.plan_start(str(tmp_path / "missing.pth"))


def test_commit_checks_record_epochs(tmp_path):
    run = make_run(tmp_path / "run", 0, [])
    with pytest.raises(ValueError, match="epoch 3 committed with epoch 0"):
        run.commit(epoch=0, checkpoint={}, records=[{"epoch": 3}])
    assert not run.last_path.exists() and not run.metrics_path.exists()
