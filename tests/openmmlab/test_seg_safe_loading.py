"""mmengine loads local checkpoints with weights_only=True on every torch (vmamba2d.openmmlab.checkpoint_safety):
seg/test.py refuses a malicious checkpoint even under torch's pre-2.6 default, emulated with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mmseg", reason="the seg extra (mmsegmentation, mmengine, mmcv) is not installed")

import vmamba2d.seg  # noqa: E402,F401  (registers the weights-only local loader)
from mmengine.logging import HistoryBuffer  # noqa: E402
from mmengine.runner import CheckpointLoader  # noqa: E402
from support.seg_runs import TINY_CONFIG, load_seg_script, run_options  # noqa: E402
from vmamba2d.openmmlab.errors import InputError, RefusedCheckpointError  # noqa: E402


class _MakesFolder:
    """Unpickling it runs ``os.mkdir(path)``: stands for any code a malicious checkpoint executes."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.fixture
def old_torch_default(monkeypatch):
    """torch.load without weights_only unpickles anything, as torch 2.4 / 2.5 did."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")


@pytest.mark.usefixtures("old_torch_default")
def test_seg_test_refuses_a_malicious_checkpoint_in_one_line(ade_root, tmp_path, capsys):
    executed = tmp_path / "executed"
    malicious = tmp_path / "malicious.pth"
    torch.save({"meta": {}, "state_dict": {}, "payload": _MakesFolder(executed)}, malicious)
    test = load_seg_script("test")
    argv = [str(TINY_CONFIG), str(malicious), "--work-dir", str(tmp_path / "eval"),
            "--cfg-options", *run_options(ade_root, max_iters=1)]
    refused = rf"^checkpoint {malicious} refused: [^\n]*GLOBAL {os.mkdir.__module__}\.mkdir"  # one line
    with pytest.raises(RefusedCheckpointError, match=refused):
        test.evaluate(argv)
    assert not executed.exists()
    capsys.readouterr()
    assert test.main(argv) == 2  # the command line: one line on stderr, exit code 2
    # (mmengine's loggers of earlier in-process runs may write to stderr too)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("test.py:")]
    assert len(errors) == 1 and errors[0].startswith(f"test.py: error: checkpoint {malicious} refused: "), errors
    assert errors[0].endswith("re-save only its state dict (tensors) and load that")  # the whole message
    assert not executed.exists()


@pytest.mark.usefixtures("old_torch_default")
def test_genuine_mmengine_checkpoint_loads_and_unreadable_files_are_named(tmp_path):
    buffer = HistoryBuffer()
    buffer.update(0.75)
    weights = {"backbone.w": torch.arange(6.0).reshape(2, 3)}
    genuine = tmp_path / "iter_2.pth"
    torch.save({"meta": {"iter": 2, "experiment_name": "tiny_20261122_210000"}, "state_dict": weights,
                "message_hub": {"log_scalars": {"train/loss": buffer},
                                "runtime_info": {"best_score": np.float64(41.5), "iter": 2}}}, genuine)
    loaded = CheckpointLoader.load_checkpoint(str(genuine), map_location="cpu")
    torch.testing.assert_close(loaded["state_dict"]["backbone.w"], weights["backbone.w"], rtol=0, atol=0)
    assert loaded["message_hub"]["log_scalars"]["train/loss"].current() == 0.75
    assert loaded["message_hub"]["runtime_info"]["best_score"] == 41.5

    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(genuine.read_bytes()[:100])
    with pytest.raises(InputError, match=rf"^checkpoint {truncated} cannot be read: RuntimeError: [^\n]*$"):
        CheckpointLoader.load_checkpoint(str(truncated))
    with pytest.raises(FileNotFoundError, match="checkpoint not found: .*missing.pth"):
        CheckpointLoader.load_checkpoint(str(tmp_path / "missing.pth"))
