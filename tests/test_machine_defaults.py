"""Defaults that fit the machine (vmamba2d.machine): on CPU no autocast unless asked, data workers
at most the available cores; the ImageNet scripts apply them, say them once in the log, number
epochs as metrics.jsonl does and evaluate at the size the run trained at."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from vmamba2d import machine
from vmamba2d.classification import eval as eval_cli
from vmamba2d.classification import train as train_cli
from vmamba2d.classification.config import resolve_train_config

from support.tiny_imagefolder import make_tiny_imagefolder


def test_available_cores_is_the_affinity_mask():
    assert machine.available_cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("device, explicit, expected", [
    ("cpu", (), ("none", 2)),
    ("cpu", ("amp",), ("bf16", 2)),
    ("cpu", ("amp", "workers"), ("bf16", 8)),
    ("cuda", (), ("bf16", 2)),
])
def test_fit_to_machine(monkeypatch, device, explicit, expected):
    monkeypatch.setattr(machine, "available_cores", lambda: 2)
    assert machine.fit_to_machine(device, "bf16", 8, explicit) == expected


def test_workers_share_the_cores_between_processes_of_a_node(monkeypatch):
    monkeypatch.setattr(machine, "available_cores", lambda: 16)
    assert machine.fit_to_machine("cuda", "bf16", 8, (), processes_per_node=4) == ("bf16", 4)
    assert machine.fit_to_machine("cuda", "bf16", 8, (), processes_per_node=32) == ("bf16", 1)
    assert machine.fit_to_machine("cuda", "bf16", 0, ()) == ("bf16", 0)


def test_recipe_on_cpu_runs_without_autocast_unless_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "available_cores", lambda: 2)
    common = ["--config", "vmamba2d_tiny", "--data-dir", str(tmp_path), "--output", str(tmp_path / "run"),
              "--device", "cpu"]
    cfg = resolve_train_config(common)
    assert (cfg.amp, cfg.workers) == ("none", 2)  # the recipe says bf16 and 8
    cfg = resolve_train_config(common + ["--amp", "bf16", "--workers", "3"])
    assert (cfg.amp, cfg.workers) == ("bf16", 3)


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """One epoch of a small model on CPU with the machine's defaults (no --amp / --workers)."""
    root = tmp_path_factory.mktemp("machine")
    data = make_tiny_imagefolder(root / "data", train_per_class=4, val_per_class=2)
    output = root / "run"
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    real_setup = train_cli.setup_logger

    def setup_and_keep(*args, **kwargs):
        log = real_setup(*args, **kwargs)
        log.addHandler(Keep())
        return log

    train_cli.setup_logger = setup_and_keep
    try:
        code = train_cli.main(["--model", "test_convnext", "--data-dir", str(data), "--output", str(output),
                               "--epochs", "1", "--batch-size", "4", "--img-size", "48", "--device", "cpu",
                               "--lr-base-batch", "0", "--mixup", "0", "--cutmix", "0", "--aa", "none",
                               "--reprob", "0", "--no-progress", "--seed", "0"])
    finally:
        train_cli.setup_logger = real_setup
    assert code == 0
    return output, records


@pytest.mark.slow
def test_log_says_amp_and_workers_once_and_numbers_epochs_as_metrics(one_epoch_run):
    output, records = one_epoch_run
    setting = [r for r in records if "data worker(s)" in r]
    assert len(setting) == 1 and "amp none" in setting[0] and f"{machine.available_cores()} core(s)" in setting[0]
    (epoch_line,) = [r for r in records if r.startswith("epoch ")]
    epochs = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in epochs if r["type"] == "epoch"]
    assert epoch_line.startswith(f"epoch {record['epoch']} (1 of 1)")
    assert f"(epoch {record['best_epoch']})" in epoch_line


def test_eval_defaults_to_the_size_the_run_trained_at(one_epoch_run, tmp_path):
    output, _ = one_epoch_run
    assert eval_cli.trained_img_size(output / "best.pth") == 48
    torch.save({"stem.weight": torch.zeros(1)}, tmp_path / "plain.pth")
    assert eval_cli.trained_img_size(tmp_path / "plain.pth") == eval_cli.DEFAULT_IMG_SIZE
    assert eval_cli.trained_img_size(tmp_path / "missing.pth") == eval_cli.DEFAULT_IMG_SIZE
