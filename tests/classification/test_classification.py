"""classification/train.py and eval.py on a generated tiny ImageFolder (CPU, 32x32 images).

Most runs call ``main(argv)`` in-process; the torchrun test and one eval run use subprocesses.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vmamba2d.classification import eval as eval_cli
from vmamba2d.classification import train as train_cli
from vmamba2d.classification.checkpoint import BEST_NAME, LAST_NAME, load_checkpoint_file
from vmamba2d.classification.config import resolve_train_config
from vmamba2d.classification.errors import UsageError
from support.tiny_imagefolder import make_tiny_imagefolder
from vmamba2d.runs import read_metrics

REPO = Path(__file__).resolve().parents[2]

TRAIN_IMAGES, VAL_IMAGES, NUM_CLASSES = 8 * 3, 4 * 3, 3


pytestmark = pytest.mark.usefixtures("one_thread_module")  # one intra-op thread: reproducible, and fast on 2 cores


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return make_tiny_imagefolder(tmp_path_factory.mktemp("imagefolder"))


def quick_args(data: Path, output: Path, epochs: int, model: str = "test_convnext",
               batch_size: int = 8) -> list[str]:
    """A fast, learnable setting: no mixup / RandAugment / erasing / jitter, fixed lr."""
    return ["--model", model, "--data-dir", str(data), "--output", str(output),
            "--epochs", str(epochs), "--batch-size", str(batch_size), "--img-size", "32",
            "--device", "cpu", "--amp", "none", "--workers", "0", "--seed", "7",
            "--warmup-epochs", "1", "--warmup-lr", "1e-4", "--lr", "3e-3", "--min-lr", "1e-5",
            "--lr-base-batch", "0", "--mixup", "0", "--cutmix", "0", "--smoothing", "0",
            "--reprob", "0", "--aa", "none", "--color-jitter", "0", "--model-ema-decay", "0.8",
            "--no-progress"]


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def epoch_records(output: Path) -> list[dict]:
    return [r for r in read_metrics(output / "metrics.jsonl") if r["type"] == "epoch"]


@pytest.fixture(scope="module")
def reference_run(data_root, tmp_path_factory) -> Path:
    """An uninterrupted 3-epoch run."""
    output = tmp_path_factory.mktemp("reference") / "run"
    assert train_cli.main(quick_args(data_root, output, epochs=3)) == 0
    return output


def test_loss_goes_down_and_run_folder_is_complete(reference_run):
    records = epoch_records(reference_run)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert [r["step"] for r in records] == [3, 6, 9]  # 24 images / batch 8, one update per batch
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert records[-1]["val_top1"] >= 90.0  # chance is 33 %
    assert all(r["val_images"] == VAL_IMAGES for r in records)
    for name in (LAST_NAME, BEST_NAME, "config.yaml", "log.txt"):
        assert (reference_run / name).is_file(), name
    assert not [p.name for p in reference_run.iterdir() if ".tmp" in p.name]
    last = load_checkpoint_file(reference_run / LAST_NAME)
    assert (last["epoch"], last["global_step"], last["model_name"]) == (3, 9, "test_convnext")
    assert last["classes"] == ["blue", "green", "red"]
    assert set(last) >= {"model", "model_ema", "optimizer", "scheduler", "scaler", "rng",
                         "best_top1"}
    # cosine schedule reached the floor on the last update
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-5)


class SimulatedCrash(Exception):
    pass


def test_kill_mid_epoch_then_resume_auto_matches_uninterrupted_run(
        data_root, reference_run, tmp_path, monkeypatch):
    output = tmp_path / "run"
    real_train_one_epoch = train_cli.train_one_epoch

    class CrashingLoader:
        """The epoch-2 loader: two batches are trained (weights change), then the process dies."""

        def __init__(self, loader):
            self.loader = loader

        def __len__(self):
            return len(self.loader)

        def __iter__(self):
            for index, batch in enumerate(self.loader):
                if index == 2:
                    raise SimulatedCrash
                yield batch

    def crash_in_third_epoch(**kwargs):
        if kwargs["epoch"] == 2:
            kwargs["loader"] = CrashingLoader(kwargs["loader"])
        return real_train_one_epoch(**kwargs)

    monkeypatch.setattr(train_cli, "train_one_epoch", crash_in_third_epoch)
    with pytest.raises(SimulatedCrash):
        train_cli.main(quick_args(data_root, output, epochs=3))
    saved = load_checkpoint_file(output / LAST_NAME)
    assert (saved["epoch"], saved["global_step"]) == (2, 6)  # only the unfinished epoch is lost

    monkeypatch.setattr(train_cli, "train_one_epoch", real_train_one_epoch)
    assert train_cli.main(quick_args(data_root, output, epochs=3) + ["--resume", "auto"]) == 0

    assert_same_run(output, reference_run)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_cpu_processes(data_root, tmp_path):
    output = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               str(REPO / "classification" / "train.py"),
               *quick_args(data_root, output, epochs=2, batch_size=4)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = epoch_records(output)
    # 24 images over 2 processes x 4 per batch: 3 updates per epoch; val images counted once
    assert [(r["epoch"], r["step"]) for r in records] == [(0, 3), (1, 6)]
    assert all(r["val_images"] == VAL_IMAGES for r in records)
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    last = load_checkpoint_file(output / LAST_NAME)
    assert last["world_size"] == 2 and len(last["rng"]) == 2
    assert not any(k.startswith("module.") for k in last["model"])


def run_eval(capsys, argv: list[str]) -> dict:
    assert eval_cli.main([*argv, "--device", "cpu", "--workers", "0", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_eval_reports_the_training_runs_accuracy(data_root, reference_run, tmp_path, capsys):
    best = load_checkpoint_file(reference_run / BEST_NAME)
    record = best["metrics"]
    common = ["--model", "test_convnext", "--data-dir", str(data_root), "--img-size", "32",
              "--crop-pct", "0.875", "--interpolation", "bicubic", "--batch-size", "5"]
    model_result = run_eval(capsys, [*common, "--checkpoint", str(reference_run / BEST_NAME)])
    assert model_result["images"] == VAL_IMAGES
    assert model_result["top1"] == pytest.approx(record["val_top1"])
    assert model_result["loss"] == pytest.approx(record["val_loss"], rel=1e-5)
    assert model_result["top5"] == 100.0  # 3 classes: the true one is always in the top 5
    assert model_result["img_per_s"] > 0
    ema_result = run_eval(capsys, [*common, "--checkpoint", str(reference_run / BEST_NAME),
                                   "--use-ema"])
    assert ema_result["loss"] == pytest.approx(record["ema_loss"], rel=1e-5)
    # a plain state dict goes through timm's pretrained loading and gives the same numbers
    plain = tmp_path / "plain.pth"
    torch.save(best["model"], plain)
    plain_result = run_eval(capsys, [*common, "--checkpoint", str(plain)])
    assert plain_result["loss"] == pytest.approx(model_result["loss"], rel=1e-6)
    # an official-style file ({"model": ..., "model_ema": ...}) with --use-ema
    official = tmp_path / "official.pth"
    torch.save({"model": best["model"], "model_ema": best["model_ema"]}, official)
    official_result = run_eval(capsys, [*common, "--checkpoint", str(official), "--use-ema"])
    assert official_result["loss"] == pytest.approx(ema_result["loss"], rel=1e-6)


def test_vmamba2d_model_trains_and_evaluates(data_root, tmp_path, capsys):
    output = tmp_path / "vm"
    tiny = ["--model-kwargs", "dims=16", "depths=[1,1,1,1]", "scan_backend=torch"]
    argv = quick_args(data_root, output, epochs=2, model="vmamba2d_tiny") + tiny
    assert train_cli.main(argv + ["--drop-path", "0.1"]) == 0
    capsys.readouterr()
    records = epoch_records(output)
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["step"] == 6
    # model_kwargs come from the checkpoint; --data-dir may point at the val folder itself
    evaluated = run_eval(capsys, ["--model", "vmamba2d_tiny", "--checkpoint",
                                  str(output / LAST_NAME), "--data-dir", str(data_root / "val"),
                                  "--img-size", "32", "--crop-pct", "0.875"])
    assert evaluated["top1"] == pytest.approx(records[-1]["val_top1"])
    assert evaluated["images"] == VAL_IMAGES
    # the same weights in the public VMamba v2 layout (docs/models.md) load through timm's filter
    trained = load_checkpoint_file(output / LAST_NAME)
    official = tmp_path / "official_layout.pth"
    torch.save({"model": official_vmamba_layout(trained["model"]),
                "model_ema": official_vmamba_layout(trained["model_ema"])}, official)
    common = ["--model", "vmamba2d_tiny", *tiny, "--data-dir", str(data_root), "--img-size", "32",
              "--crop-pct", "0.875", "--checkpoint", str(official)]
    from_official = run_eval(capsys, common)
    assert from_official["loss"] == pytest.approx(evaluated["loss"], rel=1e-6)
    ema_from_official = run_eval(capsys, [*common, "--use-ema"])
    assert ema_from_official["loss"] == pytest.approx(records[-1]["ema_loss"], rel=1e-5)


def official_vmamba_layout(state_dict: dict) -> dict:
    """Rename our VMamba keys to the public VMamba v2 names (docs/models.md); 1x1 convs → Linear."""
    stem = {"conv1": "0", "norm1": "2", "conv2": "5", "norm2": "7"}
    renamed = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if parts[0] == "stem":
            name = f"patch_embed.{stem[parts[1]]}." + ".".join(parts[2:])
        elif parts[0] == "stages" and parts[2] == "blocks":
            name = f"layers.{parts[1]}." + ".".join(parts[2:])
        elif parts[0] == "stages" and parts[2] == "downsample":
            index = {"conv": "1", "norm": "3"}[parts[3]]
            name = f"layers.{int(parts[1]) - 1}.downsample.{index}." + ".".join(parts[4:])
        elif parts[0] == "norm":
            name = "classifier." + key
        elif parts[:2] == ["head", "fc"]:
            name = "classifier.head." + ".".join(parts[2:])
        else:
            raise AssertionError(f"unexpected key {key}")
        if value.dim() == 4 and value.shape[2:] == (1, 1):
            value = value.flatten(1)
        renamed[name] = value
    return renamed


# ---------------------------------------------------------------- bad input ----------------

def expect_usage_error(capsys, argv: list[str], *fragments: str, cli=train_cli) -> str:
    assert cli.main(argv) == 2
    message = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_and_empty_data_dir(tmp_path, capsys):
    output = tmp_path / "out"
    expect_usage_error(capsys, quick_args(tmp_path / "nowhere", output, 2), "--data-dir",
                       "not found")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "val").mkdir()
    expect_usage_error(capsys, quick_args(tmp_path / "empty", output, 2), "no class sub-folders")
    (tmp_path / "empty" / "train" / "cat").mkdir()
    expect_usage_error(capsys, quick_args(tmp_path / "empty", output, 2), "without images", "cat")
    assert not output.exists()


def test_train_and_val_classes_differ(tmp_path, capsys):
    data = make_tiny_imagefolder(tmp_path / "data", train_per_class=2, val_per_class=1)
    (data / "val" / "red").rename(data / "val" / "purple")
    output = tmp_path / "out"
    expect_usage_error(capsys, quick_args(data, output, 2), "differ", "red", "purple")
    assert not output.exists()


def test_unknown_model_name(data_root, tmp_path, capsys):
    output = tmp_path / "out"
    expect_usage_error(capsys, quick_args(data_root, output, 2, model="vmamba2d_tinny"),
                       "unknown model name 'vmamba2d_tinny'", "vmamba2d_tiny")
    assert not output.exists()
    expect_usage_error(capsys, ["--model", "no_such_net", "--checkpoint", "x.pth", "--data-dir",
                                str(data_root)], "unknown model name", cli=eval_cli)


def test_existing_run_is_never_overwritten(data_root, reference_run, tmp_path, capsys):
    before = file_digest(reference_run / LAST_NAME)
    expect_usage_error(capsys, quick_args(data_root, reference_run, 2), "already holds",
                       "--resume auto")
    other = tmp_path / "other.pth"
    other.write_bytes((reference_run / LAST_NAME).read_bytes())
    expect_usage_error(capsys, quick_args(data_root, reference_run, 2) + ["--resume", str(other)],
                       "would overwrite")
    assert file_digest(reference_run / LAST_NAME) == before
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    expect_usage_error(capsys, quick_args(data_root, tmp_path / "busy", 2), "not empty")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]


def test_resume_from_another_models_checkpoint(data_root, reference_run, tmp_path, capsys):
    output = tmp_path / "out"
    checkpoint = str(reference_run / LAST_NAME)
    expect_usage_error(capsys, quick_args(data_root, output, 2, model="test_resnet")
                       + ["--resume", checkpoint], "trained as 'test_convnext'", "test_resnet")
    # same name but other weights: keys are checked before anything is loaded or written
    foreign = tmp_path / "foreign.pth"
    ckpt = load_checkpoint_file(reference_run / LAST_NAME)
    ckpt["model"] = {"fc.weight": torch.zeros(3, 4)}
    torch.save(ckpt, foreign)
    expect_usage_error(capsys, quick_args(data_root, output, 2) + ["--resume", str(foreign)],
                       "missing keys (", "unexpected keys (1): fc.weight")
    assert not output.exists()
    expect_usage_error(capsys, ["--model", "test_resnet", "--checkpoint", checkpoint,
                                "--data-dir", str(data_root)], "trained as 'test_convnext'",
                       cli=eval_cli)
    plain = tmp_path / "plain.pth"
    torch.save(ckpt["model_ema"], plain)
    message = expect_usage_error(
        capsys, ["--model", "test_resnet", "--checkpoint", str(plain), "--data-dir",
                 str(data_root), "--device", "cpu"],
        "does not fit model 'test_resnet' with 3 classes", "missing keys (", "conv1.0.weight",
        "unexpected keys (", "stem.0.weight", cli=eval_cli)
    assert message.count("does not fit") == 1 and len(message) < 1500, message


def test_recipe_files_hold_the_design_recipe():
    expected_drop_path = {"tiny": 0.2, "small": 0.3, "base": 0.6}
    for family in ("vmamba2d", "vmamba"):
        for size, drop_path in expected_drop_path.items():
            name = f"{family}_{size}"
            cfg = resolve_train_config(["--config", name, "--data-dir", "d", "--output", "o"])
            assert cfg.model == name and cfg.drop_path == drop_path
            assert (cfg.epochs, cfg.warmup_epochs, cfg.weight_decay, cfg.clip_grad) == (
                300, 20, 0.05, 5.0)
            assert (cfg.mixup, cfg.cutmix, cfg.smoothing, cfg.reprob) == (0.8, 1.0, 0.1, 0.25)
            assert cfg.aa == "rand-m9-mstd0.5-inc1" and cfg.model_ema_decay == 0.9999
            # 8 processes x 128 = 1024 images per update → lr 1e-3 (docs/training.md)
            assert cfg.lr * cfg.lr_scale(world_size=8) == pytest.approx(1e-3)
    with pytest.raises(UsageError, match="--config"):
        resolve_train_config(["--config", "no_such_recipe", "--data-dir", "d", "--output", "o"])
    cfg = resolve_train_config(["--config", "vmamba2d_tiny", "--data-dir", "d", "--output", "o",
                                "--clip-grad", "none", "--no-model-ema", "--accum-steps", "8",
                                "--batch-size", "128"])
    assert cfg.clip_grad is None and cfg.model_ema is False
    assert cfg.lr * cfg.lr_scale(world_size=1) == pytest.approx(1e-3)


def test_gradient_accumulation_matches_the_full_batch(data_root, tmp_path):
    """batch 4 x 2 accumulation steps = batch 8 (same images per update, per-sample norms).

    SGD without clipping, so a wrongly scaled accumulated gradient changes the weights."""
    overrides = ["--warmup-epochs", "0", "--drop-path", "0", "--opt", "sgd", "--lr", "0.05",
                 "--clip-grad", "none"]
    full, accumulated = tmp_path / "full", tmp_path / "accumulated"
    assert train_cli.main(quick_args(data_root, full, 1) + overrides) == 0
    assert train_cli.main(quick_args(data_root, accumulated, 1, batch_size=4) + overrides
                          + ["--accum-steps", "2"]) == 0
    want, got = (load_checkpoint_file(p / LAST_NAME) for p in (full, accumulated))
    assert want["global_step"] == got["global_step"] == 3
    for key, value in want["model"].items():
        torch.testing.assert_close(got["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_with_recipe_augmentation(data_root, tmp_path, amp):
    """AMP (fp16 with a GradScaler) plus the recipe's mixup/cutmix, RandAugment, erasing, jitter."""
    output = tmp_path / amp
    recipe_augmentation = ["--mixup", "0.8", "--cutmix", "1.0", "--smoothing", "0.1",
                           "--reprob", "0.25", "--aa", "rand-m9-mstd0.5-inc1",
                           "--color-jitter", "0.4", "--accum-steps", "2", "--batch-size", "4"]
    assert train_cli.main(quick_args(data_root, output, 2) + ["--amp", amp]
                          + recipe_augmentation) == 0
    records = epoch_records(output)
    assert [r["step"] for r in records] == [3, 6]
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in records)
    scaler = load_checkpoint_file(output / LAST_NAME)["scaler"]
    assert bool(scaler) == (amp == "fp16")  # GradScaler state only when it is enabled


# ---------------------------------------------------------------- crash safety -------------

def metric_values(records: list[dict]) -> list[dict]:
    """Epoch records without the wall-clock fields."""
    timing = {"time", "train_seconds", "train_img_per_s"}
    return [{k: v for k, v in r.items() if k not in timing} for r in records]


def assert_same_run(got: Path, want: Path) -> None:
    """Bitwise-equal final weights (model and EMA), metrics and best.pth."""
    assert metric_values(epoch_records(got)) == metric_values(epoch_records(want))
    for name in (LAST_NAME, BEST_NAME):
        final, expected = load_checkpoint_file(got / name), load_checkpoint_file(want / name)
        assert final["epoch"] == expected["epoch"], name
        for part in ("model", "model_ema"):
            for key, value in expected[part].items():
                assert torch.equal(final[part][key], value), f"{name} {part} {key}"


@pytest.mark.slow
def test_kill_and_resume_with_loader_workers_reproduces_the_run_bitwise(
        data_root, reference_run, tmp_path, monkeypatch):
    """Killed mid-epoch with 2 loader workers, resumed with 2 workers: the same weights and
    metrics, bit for bit, as the uninterrupted reference (which loaded in the main process)."""
    output = tmp_path / "run"
    workers = ["--workers", "2"]
    real_train_one_epoch = train_cli.train_one_epoch

    def crash_in_third_epoch(**kwargs):
        if kwargs["epoch"] == 2:
            loader = kwargs["loader"]

            class CrashingLoader:
                def __len__(self):
                    return len(loader)

                def __iter__(self):
                    for index, batch in enumerate(loader):
                        if index == 2:
                            raise SimulatedCrash
                        yield batch
            kwargs["loader"] = CrashingLoader()
        return real_train_one_epoch(**kwargs)

    monkeypatch.setattr(train_cli, "train_one_epoch", crash_in_third_epoch)
    with pytest.raises(SimulatedCrash):
        train_cli.main(quick_args(data_root, output, epochs=3) + workers)
    monkeypatch.setattr(train_cli, "train_one_epoch", real_train_one_epoch)
    assert train_cli.main(quick_args(data_root, output, epochs=3) + workers
                          + ["--resume", "auto"]) == 0
    assert_same_run(output, reference_run)


@pytest.mark.parametrize("kill", ["before_last", "after_last"])
def test_kill_around_the_commit_point_is_repaired_on_resume(
        data_root, reference_run, tmp_path, monkeypatch, kill):
    """The process dies just before / just after last.pth of the last epoch is replaced."""
    import vmamba2d.runs.checkpoint as checkpoint_module
    output = tmp_path / "run"
    real_replace = os.replace
    evaluations = []
    real_evaluate = train_cli.evaluate

    def counting_evaluate(*args, **kwargs):
        evaluations.append(kwargs.get("desc"))
        return real_evaluate(*args, **kwargs)

    def dying_replace(src, dst):
        in_last_epoch = len(evaluations) == 6  # model + EMA evaluation of each of 3 epochs
        if in_last_epoch and Path(dst).name == LAST_NAME and kill == "before_last":
            raise SimulatedCrash
        real_replace(src, dst)
        if in_last_epoch and Path(dst).name == LAST_NAME and kill == "after_last":
            raise SimulatedCrash

    monkeypatch.setattr(train_cli, "evaluate", counting_evaluate)
    monkeypatch.setattr(checkpoint_module.os, "replace", dying_replace)
    with pytest.raises(SimulatedCrash):
        train_cli.main(quick_args(data_root, output, epochs=3))
    monkeypatch.undo()
    assert load_checkpoint_file(output / LAST_NAME)["epoch"] == (2 if kill == "before_last" else 3)
    # metrics.jsonl and best.pth are never behind last.pth
    assert [r["epoch"] for r in epoch_records(output)] == [0, 1, 2]
    stale = output / ".last.pth.tmp-999999"  # what a SIGKILL during a write leaves
    stale.write_bytes(b"partial")
    assert train_cli.main(quick_args(data_root, output, epochs=3) + ["--resume", "auto"]) == 0
    assert not stale.exists()
    assert_same_run(output, reference_run)
    assert sorted(p.name for p in output.iterdir()) == sorted(
        p.name for p in reference_run.iterdir())


def test_resume_auto_refuses_a_non_empty_folder_without_last(data_root, tmp_path, capsys):
    output = tmp_path / "busy"
    output.mkdir()
    (output / "notes.txt").write_text("keep me")
    (output / "best.pth").write_bytes(b"someone else's")
    expect_usage_error(capsys, quick_args(data_root, output, 2) + ["--resume", "auto"],
                       str(output), "no last.pth", "best.pth, notes.txt", "--output")
    assert sorted(p.name for p in output.iterdir()) == ["best.pth", "notes.txt"]


def test_resume_auto_restarts_a_run_killed_in_its_first_epoch(data_root, reference_run,
                                                               tmp_path, monkeypatch):
    output = tmp_path / "run"
    monkeypatch.setattr(train_cli, "train_one_epoch", lambda **kwargs: (_ for _ in ()).throw(
        SimulatedCrash))
    with pytest.raises(SimulatedCrash):
        train_cli.main(quick_args(data_root, output, epochs=3))
    monkeypatch.undo()
    assert not (output / LAST_NAME).exists() and (output / "run.json").exists()
    assert train_cli.main(quick_args(data_root, output, epochs=3) + ["--resume", "auto"]) == 0
    assert_same_run(output, reference_run)
    assert "never finished its first epoch" in (output / "log.txt").read_text()


# ---------------------------------------------------------------- validation ---------------

def test_arguments_are_validated_before_anything_is_written(data_root, tmp_path, capsys):
    output = tmp_path / "out"
    base = quick_args(data_root, output, 2)
    expect_usage_error(capsys, base + ["--img-size", "2"], "--img-size 2", "test_convnext")
    expect_usage_error(capsys, base + ["--opt", "adamz"], "--opt", "adamz")
    expect_usage_error(capsys, base + ["--sched", "cosinus"], "--sched", "cosinus")
    expect_usage_error(capsys, base + ["--seed", "-1"], "--seed must be >= 0")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("epochs: ten\nmodel_ema: 1\n")
    expect_usage_error(capsys, ["--config", str(recipe), *base[:6]], "epochs", "'ten'", "int")
    recipe.write_text("interpolation: cubic\n")
    expect_usage_error(capsys, ["--config", str(recipe), *base], "interpolation", "'cubic'",
                       "bicubic")
    assert not output.exists()


def test_non_finite_learning_rates_are_refused_before_anything_is_written(data_root, tmp_path,
                                                                          capsys):
    output = tmp_path / "out"
    for value in ("inf", "nan"):
        expect_usage_error(capsys, quick_args(data_root, output, 2) + ["--lr", value],
                           f"--lr must be a finite number, got {value}")
    expect_usage_error(capsys, quick_args(data_root, output, 2) + ["--min-lr", "nan"],
                       "--min-lr must be a finite number")
    assert not output.exists()


class _Payload:
    def __reduce__(self):
        return (os.getcwd, ())


def test_unloadable_checkpoints_are_described_by_what_is_wrong(data_root, tmp_path, capsys):
    refused = tmp_path / "refused.pth"
    torch.save({"model": {}, "where": Path("/somewhere")}, refused)
    payload = tmp_path / "payload.pth"
    torch.save({"model": _Payload()}, payload)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(bytes(range(256)) * 8)
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    expected = {
        refused: ["refuses (Unsupported global: GLOBAL pathlib.PosixPath",
                  "If you trust the file, load it with torch.load(..., weights_only=False)"],
        payload: ["refuses (Trying to load unsupported GLOBAL posix.getcwd"],
        garbage: ["is not a torch checkpoint (unreadable pickle: Unsupported operand"],
        empty: ["is empty (0 bytes)"],
    }
    for path, fragments in expected.items():
        message = expect_usage_error(capsys, quick_args(data_root, tmp_path / "run", 2)
                                     + ["--resume", str(path)], str(path), *fragments)
        assert "--trust-checkpoint" not in message  # train.py has no such option
        assert len(message.strip().splitlines()) == 1, message
    with pytest.raises(UsageError, match="If you trust the file, pass --trust-checkpoint"):
        load_checkpoint_file(refused)  # eval.py's default: it has the option


def test_img_size_the_model_accepts_trains(data_root, tmp_path):
    """Sizes are checked against the model with one forward pass, not a fixed rule."""
    output = tmp_path / "odd"
    assert train_cli.main(quick_args(data_root, output, 1) + ["--img-size", "36"]) == 0
    assert epoch_records(output)[0]["val_images"] == VAL_IMAGES


def test_short_run_clamps_the_recipe_warmup(data_root, tmp_path, capsys):
    clamped, explicit = tmp_path / "clamped", tmp_path / "explicit"
    assert train_cli.main(quick_args(data_root, clamped, 2) + ["--warmup-epochs", "20"]) == 0
    assert "--warmup-epochs 20 does not fit a run of 2 epochs" in capsys.readouterr().err
    assert "warmup_epochs: 1" in (clamped / "config.yaml").read_text()
    assert train_cli.main(quick_args(data_root, explicit, 2) + ["--warmup-epochs", "1"]) == 0
    assert ([r["lr"] for r in epoch_records(clamped)]
            == [r["lr"] for r in epoch_records(explicit)])


def test_unreadable_image_stops_cleanly_or_is_skipped_with_a_count(tmp_path, monkeypatch,
                                                                   capsys):
    data = make_tiny_imagefolder(tmp_path / "data")
    output = tmp_path / "run"
    bad = data / "train" / "green" / "green_003.png"
    real_train_one_epoch = train_cli.train_one_epoch

    def corrupt_before_second_epoch(**kwargs):
        if kwargs["epoch"] == 1:
            bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
        return real_train_one_epoch(**kwargs)

    monkeypatch.setattr(train_cli, "train_one_epoch", corrupt_before_second_epoch)
    message = expect_usage_error(capsys, quick_args(data, output, 2), str(bad),
                                 "--skip-bad-images", "--resume auto")
    assert "epoch 1 (2 of 2)" in message and "the 1 finished epoch(s)" in message, message
    saved = load_checkpoint_file(output / LAST_NAME)
    assert saved["epoch"] == 1  # the finished epoch is kept
    assert [r["epoch"] for r in epoch_records(output)] == [0]
    monkeypatch.undo()
    val_bad = data / "val" / "red" / "red_000.png"
    val_bad.write_bytes(b"not an image")
    assert train_cli.main(quick_args(data, output, 2) + ["--resume", "auto",
                                                         "--skip-bad-images"]) == 0
    record = epoch_records(output)[-1]
    assert (record["epoch"], record["train_bad_images"], record["val_bad_images"]) == (1, 1, 1)
    assert record["val_images"] == VAL_IMAGES - 1
    log = (output / "log.txt").read_text()
    assert str(bad) in log and str(val_bad) in log


def test_a_diverged_run_stops_with_a_message_instead_of_a_traceback(data_root, tmp_path, capsys):
    output = tmp_path / "run"
    argv = quick_args(data_root, output, epochs=2) + ["--lr", "1e30", "--warmup-epochs", "0"]
    assert train_cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "train.py: error: training loss is" in err and "--resume auto" in err
    assert "Traceback" not in err
