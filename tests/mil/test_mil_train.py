"""MIL training / evaluation CLI (vmamba2d.mil.cli behind mil/train.py and mil/eval.py) on tiny
synthetic slide files, CPU: configs, bad input, epoch selection, exact resume, survival bins."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from vmamba2d.mil import runner
from vmamba2d.mil.cli import eval_main, train_main
from vmamba2d.mil.config import CONFIG_DIR, MILConfig, resolve_train_config
from vmamba2d.mil.engine import select_epoch
from vmamba2d.mil.splits import survival_splits
from vmamba2d.mil.survival import survival_bin_edges
from vmamba2d.mil.synthetic import LABEL_NAMES, make_synthetic_slides, write_slide_file

IN_DIM = 8
MODEL_KWARGS = ["--model-kwargs", "dim=16", "d_state=4"]


pytestmark = pytest.mark.usefixtures("one_thread_module")  # one intra-op thread: reproducible, and fast on 2 cores


def write_labels(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("slide_id", "label", "split"))
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """12 train / 6 val / 6 test synthetic slides (U{8..12} grids, 8-d features) as .h5 files,
    plus 6 .pt slides for the survival tables."""
    root = tmp_path_factory.mktemp("mil_data")
    features = root / "features"
    features.mkdir()
    rows = []
    for split_index, (split, count) in enumerate((("train", 12), ("val", 6), ("test", 6))):
        for slide in make_synthetic_slides(count, min_size=10, max_size=16, in_dim=IN_DIM,
                                           seed=split_index, prefix=split):
            write_slide_file(slide, features, "h5" if split != "test" else "pt")
            rows.append((slide.slide_id, LABEL_NAMES[slide.label], split))
    write_labels(root / "labels.csv", rows)
    return root


def train_args(data: Path, output: Path, epochs: int = 3, labels: str = "labels.csv") -> list[str]:
    return ["--feature-dir", str(data / "features"), "--label-csv", str(data / labels),
            "--label-map", "negative=0", "positive=1", "--output", str(output),
            "--epochs", str(epochs), "--lr", "3e-3", "--device", "cpu", "--no-progress",
            "--seeds", "3", *MODEL_KWARGS]


def history(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def reference_run(dataset, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("reference") / "run"
    assert train_main(train_args(dataset, output)) == 0
    return output


# --- configs -----------------------------------------------------------------------------------

def config_args(name: str) -> list[str]:
    return ["--config", name, "--feature-dir", "f", "--label-csv", "l.csv", "--output", "o",
            "--split-csv", "splits_{fold}.csv"] if "survival" in name else \
        ["--config", name, "--feature-dir", "f", "--label-csv", "l.csv", "--output", "o"]


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_configs_load_with_the_official_recipe(name):
    cfg = resolve_train_config(config_args(name))
    assert cfg.weight_decay == 1e-5 and cfg.epochs == 20
    if name == "synthetic":
        assert cfg.lr == 1e-3 and cfg.model_kwargs["dim"] == 32
        return
    assert cfg.lr == 1e-4 and cfg.in_dim == 1024 and cfg.amp == "none"
    assert cfg.model == "mambamil2d" and cfg.model_kwargs["dim"] == 128
    assert cfg.model_kwargs["d_state"] == 16 and cfg.model_kwargs["num_blocks"] == 1
    if cfg.task == "survival":
        assert (cfg.scheduler, cfg.n_bins, cfg.alpha, cfg.select) == ("none", 4, 0.0, "last")
        assert cfg.folds == [0, 1, 2, 3, 4] and cfg.uses_folds
    else:
        assert (cfg.scheduler, cfg.select, cfg.metric) == ("cosine", "best", "auc")
        assert cfg.seeds == [0, 1, 2, 3, 4]


def test_flags_override_the_config_and_survival_defaults():
    cfg = resolve_train_config(config_args("bracs") + ["--lr", "2e-4", "--model-kwargs",
                                                       "num_blocks=2"])
    assert cfg.lr == 2e-4 and cfg.model_kwargs["num_blocks"] == 2
    assert cfg.model_kwargs["dim"] == 128  # merged, not replaced
    cfg = resolve_train_config(["--task", "survival", "--feature-dir", "f", "--label-csv", "l",
                                "--output", "o", "--split-csv", "s{fold}.csv"])
    assert (cfg.scheduler, cfg.select, cfg.metric) == ("none", "last", "cindex")
    cfg = resolve_train_config(["--task", "survival", "--feature-dir", "f", "--label-csv", "l",
                                "--output", "o", "--split-csv", "s{fold}.csv",
                                "--holdout-fraction", "0.2"])
    assert cfg.select == "best"
    with pytest.raises(ValueError, match="no '\\{fold\\}' placeholder"):
        resolve_train_config(["--task", "survival", "--feature-dir", "f", "--label-csv", "l",
                              "--output", "o", "--split-csv", "splits.csv", "--folds", "0", "1"])


# --- bad input: a clear message and nothing written ---------------------------------------------

@pytest.mark.parametrize("change, message", [
    (lambda a: [x for i, x in enumerate(a) if i not in (0, 1)], "--feature-dir is required"),
    (lambda a: a + ["--label-csv", "/nonexistent/labels.csv"], "not found"),
    (lambda a: a + ["--label-map", "negative=0", "other=1"], "not in the label map"),
    (lambda a: a + ["--model-kwargs", "colour=3"], "options of mambamil2d"),
    (lambda a: a + ["--epochs", "0"], "--epochs must be >= 1"),
    (lambda a: a + ["--amp", "bf16"], "autocast is for GPUs"),
    (lambda a: a + ["--select-metric", "cindex"], "--select-metric for task 'classification'"),
    (lambda a: a + ["--holdout-fraction", "0.2"], "survival option"),
    (lambda a: a + ["--label-csv", "{data}/no_test.csv"], "there is no test split"),
    (lambda a: a + ["--label-csv", "{data}/missing_slide.csv"], "ghost (train) -: no .h5 / .pt file"),
    (lambda a: a + ["--grid", "placement=diagonal"], "--grid"),
    (lambda a: a + ["--loss-weights", "instance=0.3"], "--loss-weights: loss term 'instance' is not one of"),
    (lambda a: a + ["--loss-weights", "slide=-1"], "must be a number >= 0"),
    (lambda a: a + ["--model-kwargs", "dim=16", "d_state=100000"], "the model fails on a test bag: A has N=100000"),
    (lambda a: a + ["--lr", "nan"], "--lr must be a finite number, got nan"),
    (lambda a: a + ["--lr", "inf"], "--lr must be a finite number, got inf"),
    (lambda a: a + ["--label-map", "negative=0", "positive=0"], "a classifier needs at least 2 classes"),
    (lambda a: a + ["--label-csv", "{data}/binary.csv"], "binary.csv: not a UTF-8 text CSV table"),
])
def test_bad_input_is_named_before_anything_is_written(dataset, tmp_path, capsys, change,
                                                       message):
    rows = list(csv.reader(open(dataset / "labels.csv")))[1:]
    write_labels(dataset / "no_test.csv", [r for r in rows if r[2] != "test"])
    write_labels(dataset / "missing_slide.csv", rows + [["ghost", "positive", "train"]])
    (dataset / "binary.csv").write_bytes(bytes(range(128, 256)) * 4)
    output = tmp_path / "run"
    args = [a.replace("{data}", str(dataset)) for a in change(train_args(dataset, output))]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not output.exists()


def test_existing_run_is_not_overwritten(dataset, reference_run, capsys):
    assert train_main(train_args(dataset, reference_run)) == 2
    assert "is not empty" in capsys.readouterr().err
    assert train_main(train_args(dataset, reference_run) + ["--resume", "--lr", "1e-2"]) == 2
    assert "options differ" in capsys.readouterr().err


def _copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_resume_removes_temp_files_of_a_killed_write(dataset, reference_run, tmp_path):
    # a kill inside an atomic write leaves .<name>.tmp-<pid> next to the file being replaced
    output = _copy_run(reference_run, tmp_path / "run")
    left = [output / ".summary.json.tmp-4242", output / ".config.yaml.tmp-4242"]
    for path in left:
        path.write_text("partial")
    assert train_main(train_args(dataset, output) + ["--resume"]) == 0
    assert not any(path.exists() for path in left)
    # killed while writing the first file: the folder holds only its temp file
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".config.yaml.tmp-77").write_text("task: classifi")
    assert train_main(train_args(dataset, fresh, epochs=1) + ["--resume"]) == 0
    assert sorted(p.name for p in fresh.iterdir()) == ["config.yaml", "seed3", "summary.json"]


def test_resume_from_a_truncated_last_checkpoint_names_the_file(dataset, reference_run,
                                                                 tmp_path, capsys):
    output = _copy_run(reference_run, tmp_path / "run")
    last = output / "seed3" / "last.pth"
    (output / "seed3" / "summary.json").unlink()  # killed before the run's summary
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    assert train_main(train_args(dataset, output) + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("mil/train.py: error:")]
    assert f"cannot read {last}" in line and "damaged" in line


def test_resume_into_another_kind_of_run_folder_says_so(dataset, tmp_path, capsys):
    from vmamba2d.runs import RunFolder, StartPlan

    classification = tmp_path / "imagenet"
    RunFolder(classification, script="classification/train.py").start(StartPlan(None, False), 0)
    (classification / "config.yaml").write_text(
        yaml.safe_dump({"model": "vmamba2d_tiny", "data_dir": "/data/imagenet", "epochs": 300}))
    assert train_main(train_args(dataset, classification) + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "not a MIL run" in err and "'classification/train.py'" in err
    assert "options differ" not in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump({"lr": 0.1}))
    assert train_main(train_args(dataset, other) + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "not a MIL run" in err and "holds no MIL options" in err


# --- selection ---------------------------------------------------------------------------------

def test_select_epoch_later_ties_win_and_loss_is_minimised():
    records = [{"val": {"auc": a, "loss": l}} for a, l in ((0.5, 0.9), (0.8, 0.7), (0.8, 0.8),
                                                         (0.6, 0.7))]
    assert select_epoch(records, "best", "auc") == 2
    assert select_epoch(records, "best", "loss") == 3
    assert select_epoch(records, "last", "auc") == 3
    records[2]["val"]["auc"] = float("nan")
    assert select_epoch(records, "best", "auc") == 1


def test_reported_metrics_are_test_at_the_epoch_chosen_on_val(reference_run):
    run = reference_run / "seed3"
    records = history(run)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    summary = json.loads((run / "summary.json").read_text())
    val_auc = [r["val"]["auc"] for r in records]
    chosen = max(i for i, v in enumerate(val_auc) if v == max(val_auc))  # independent argmax
    assert summary["selected_epoch"] == chosen
    assert summary["reported_split"] == "test"
    assert summary["reported"] == records[chosen]["test"]
    assert summary["val_at_selected"] == records[chosen]["val"]
    best = torch.load(run / "best.pth", weights_only=True)
    assert best["epoch"] == chosen
    with open(run / "predictions_test.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 6
    total = json.loads((reference_run / "summary.json").read_text())
    assert total["metrics"]["auc"]["values"] == [summary["reported"]["auc"]]


def test_training_reduces_the_loss(reference_run):
    records = history(reference_run / "seed3")
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert [r["lr"] for r in records] == pytest.approx(  # cosine over 3 epochs, per epoch
        [3e-3 * (1 + np.cos(np.pi * e / 3)) / 2 for e in range(3)])


def test_eval_cli_reproduces_the_reported_metrics(dataset, reference_run, tmp_path, capsys):
    run = reference_run / "seed3"
    predictions = tmp_path / "predictions.csv"
    assert eval_main(["--checkpoint", str(run / "best.pth"), "--split", "test", "--device",
                      "cpu", "--no-progress", "--predictions", str(predictions)]) == 0
    got = json.loads(capsys.readouterr().out)
    summary = json.loads((run / "summary.json").read_text())
    for key in ("loss", "acc", "f1", "auc"):
        assert got[key] == pytest.approx(summary["reported"][key], abs=1e-6)
    assert predictions.read_text() == (run / "predictions_test.csv").read_text()
    # another cohort's table: every row, labels mapped with the checkpoint's label map
    assert eval_main(["--checkpoint", str(run / "best.pth"), "--label-csv",
                      str(dataset / "labels.csv"), "--split", "all", "--device", "cpu",
                      "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 24
    assert eval_main(["--checkpoint", str(run / "best.pth"), "--label-csv",
                      str(dataset / "labels.csv"), "--device", "cpu", "--no-progress"]) == 2
    assert "--split all" in capsys.readouterr().err


# Small options per model (tiny 8-d features); the defaults are the official sizes.
SMALL_MODEL_KWARGS = {
    "mambamil2d": ["dim=16", "d_state=4"], "mambamil": ["dim=16", "d_state=4"], "abmil": ["dim=16"],
    "clam_sb": ["dim=16", "attn_hidden=8", "k_sample=4"], "dsmil": ["query_dim=8"],
    "transmil": ["dim=16", "heads=2", "landmarks=8"], "s4mil": ["dim=16", "d_state=4"],
    "mambamil_sr": ["dim=16", "d_state=4"], "dtfdmil": ["dim=16", "attn_hidden=8", "num_groups=2"],
}


def test_every_model_is_selectable():
    from vmamba2d.mil import MODELS
    from vmamba2d.mil.config import MODEL_NAMES

    assert set(MODEL_NAMES) == set(MODELS) == set(SMALL_MODEL_KWARGS)


@pytest.mark.parametrize("name", sorted(SMALL_MODEL_KWARGS))
def test_every_model_trains_and_evaluates_on_the_same_data(dataset, tmp_path, capsys, name):
    output = tmp_path / "run"
    args = train_args(dataset, output, epochs=1)[: -len(MODEL_KWARGS)]
    assert train_main(args + ["--model", name, "--model-kwargs", *SMALL_MODEL_KWARGS[name]]) == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["model"] == name and set(summary["metrics"]) == {"acc", "f1", "auc"}
    record = history(output / "seed3")[0]
    assert np.isfinite(record["train_loss"]) and {"acc", "f1", "auc"} <= set(record["test"])
    if name in ("clam_sb", "dsmil", "dtfdmil"):  # the auxiliary terms are logged
        assert len([k for k in record if k.startswith("train_loss_")]) == 2
    capsys.readouterr()
    assert eval_main(["--checkpoint", str(output / "seed3" / "best.pth"), "--split", "test",
                      "--device", "cpu", "--no-progress"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["auc"] == pytest.approx(summary["runs"][0]["reported"]["auc"], abs=1e-6)


def test_config_model_kwargs_belong_to_the_config_model():
    cfg = resolve_train_config(config_args("bracs") + ["--model", "transmil"])
    assert cfg.model == "transmil" and cfg.model_kwargs == {}
    cfg = resolve_train_config(config_args("bracs") + ["--model", "clam_sb", "--model-kwargs",
                                                       "subtyping=true", "--loss-weights",
                                                       "instance=0.5"])
    assert cfg.model_kwargs == {"subtyping": True} and cfg.loss_weights == {"instance": 0.5}
    assert resolve_train_config(config_args("bracs") + ["--model", "mambamil2d"]).model_kwargs[
        "dim"] == 128


class _Payload:
    def __reduce__(self):
        return (print, ("ran",))


def test_eval_cli_bad_checkpoint(tmp_path, capsys):
    assert eval_main(["--checkpoint", str(tmp_path / "none.pth")]) == 2
    assert "not found" in capsys.readouterr().err
    torch.save({"model": {}}, tmp_path / "foreign.pth")
    assert eval_main(["--checkpoint", str(tmp_path / "foreign.pth")]) == 2
    assert "not written by mil/train.py" in capsys.readouterr().err
    torch.save({"model": _Payload()}, tmp_path / "payload.pth")
    assert eval_main(["--checkpoint", str(tmp_path / "payload.pth")]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "Unsupported global: GLOBAL print" in line and "Please" not in line, line
    assert "ran" not in captured.out


def test_eval_predictions_path_is_checked_before_evaluating(reference_run, tmp_path, capsys):
    checkpoint = str(reference_run / "seed3" / "best.pth")
    for target, message in ((tmp_path / "no" / "p.csv", f"folder {tmp_path / 'no'} does not exist"),
                            (tmp_path, "is a folder")):
        assert eval_main(["--checkpoint", checkpoint, "--predictions", str(target), "--no-progress"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("mil/eval.py: error: --predictions") and message in line, line


# --- exact resume ------------------------------------------------------------------------------

class SimulatedCrash(Exception):
    pass


class CrashingDataset:
    """Serves ``after`` slides (their optimizer steps happen), then the process 'dies'."""

    def __init__(self, dataset, after: int) -> None:
        self.dataset, self.after, self.served = dataset, after, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if self.served == self.after:
            raise SimulatedCrash
        self.served += 1
        return self.dataset[index]


def test_killed_mid_epoch_then_resumed_equals_the_uninterrupted_run(dataset, reference_run,
                                                                   tmp_path, monkeypatch):
    output = tmp_path / "run"
    real = runner.train_one_epoch

    def crash_in_third_epoch(**kwargs):
        if kwargs["epoch"] == 2:
            kwargs["dataset"] = CrashingDataset(kwargs["dataset"], after=5)
        return real(**kwargs)

    monkeypatch.setattr(runner, "train_one_epoch", crash_in_third_epoch)
    with pytest.raises(SimulatedCrash):
        train_main(train_args(dataset, output))
    assert [r["epoch"] for r in history(output / "seed3")] == [0, 1]
    assert not (output / "seed3" / "summary.json").exists()

    monkeypatch.setattr(runner, "train_one_epoch", real)
    assert train_main(train_args(dataset, output) + ["--resume"]) == 0
    got, want = history(output / "seed3"), history(reference_run / "seed3")
    for a, b in zip(got, want):
        for key in ("epoch", "train_loss", "lr", "val", "test"):
            assert a[key] == b[key], key  # bitwise: same floats
    final = torch.load(output / "seed3" / "last.pth", weights_only=True)
    expected = torch.load(reference_run / "seed3" / "last.pth", weights_only=True)
    for key, value in expected["model"].items():
        assert torch.equal(final["model"][key], value), key
    summary = json.loads((output / "seed3" / "summary.json").read_text())
    reference = json.loads((reference_run / "seed3" / "summary.json").read_text())
    assert summary["reported"] == reference["reported"]


# --- survival ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def survival_data(dataset) -> Path:
    """18 patients (slides of the classification set, h5 and pt) with times, and 2 folds."""
    rng = np.random.default_rng(0)
    slides = sorted(p.stem for p in (dataset / "features").iterdir())[:18]
    times = np.round(rng.uniform(1, 100, len(slides)), 2)
    censorship = (np.arange(len(slides)) % 3 == 0).astype(int)  # 6 censored, 12 events
    with open(dataset / "surv.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("", "case_id", "slide_id", "censorship", "survival_months"))
        for i, (slide, t, c) in enumerate(zip(slides, times, censorship)):
            writer.writerow((i, f"case{i:02d}", f"{slide}.svs", c, t))
    for fold in range(2):
        val = set(range(fold * 5, fold * 5 + 5))
        train = [f"case{i:02d}" for i in range(18) if i not in val]
        if fold == 1:
            train.append("case05")  # a patient listed in train and val (UCEC-style overlap)
        val_ids = [f"case{i:02d}" for i in sorted(val)]
        with open(dataset / f"surv_splits_{fold}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("", "train", "val", "test"))
            for i in range(len(train)):
                writer.writerow((i, train[i], val_ids[i] if i < len(val_ids) else "", ""))
    return dataset


def survival_args(data: Path, output: Path, *extra: str) -> list[str]:
    return ["--task", "survival", "--feature-dir", str(data / "features"),
            "--label-csv", str(data / "surv.csv"), "--split-csv",
            str(data / "surv_splits_{fold}.csv"), "--output", str(output), "--epochs", "2",
            "--device", "cpu", "--no-progress", "--lr", "3e-3", *MODEL_KWARGS, *extra]


def read_survival_table(data: Path) -> dict[str, tuple[float, int]]:
    with open(data / "surv.csv") as handle:
        return {r["case_id"]: (float(r["survival_months"]), int(r["censorship"]))
                for r in csv.DictReader(handle)}


def test_survival_bins_use_training_patients_only(survival_data):
    cfg = MILConfig(task="survival", feature_dir=str(survival_data / "features"),
                    label_csv=str(survival_data / "surv.csv"),
                    split_csv=str(survival_data / "surv_splits_{fold}.csv"), output="o")
    table = read_survival_table(survival_data)
    splits = survival_splits(cfg, 0)
    train_ids = [f"case{i:02d}" for i in range(5, 18)]
    assert sorted(e.case_id for e in splits.train) == train_ids
    expected = survival_bin_edges([table[c][0] for c in train_ids],
                                  [table[c][1] for c in train_ids], 4)
    np.testing.assert_allclose(splits.bin_edges, expected)
    everyone = survival_bin_edges([t for t, _ in table.values()], [c for _, c in table.values()])
    assert not np.allclose(splits.bin_edges, everyone)  # val patients would move the edges
    for entry in splits.train + splits.val:
        inner = np.asarray(expected)[1:-1]
        assert entry.label == int(np.searchsorted(inner, entry.time, side="right"))
    overlap = survival_splits(cfg, 1)  # case05 in both: dropped from train, kept in val
    assert "case05" not in {e.case_id for e in overlap.train}
    assert "case05" in {e.case_id for e in overlap.val} and overlap.notes


def test_survival_run_reports_val_at_the_last_epoch_and_the_official_number(survival_data,
                                                                            tmp_path, capsys):
    output = tmp_path / "surv"
    assert train_main(survival_args(survival_data, output, "--folds", "0")) == 0
    summary = json.loads((output / "fold0-seed0" / "summary.json").read_text())
    records = history(output / "fold0-seed0")
    assert summary["selection"] == "last epoch" and summary["selected_epoch"] == 1
    assert summary["reported_split"] == "val" and summary["reported"] == records[-1]["val"]
    assert summary["official_protocol"]["val_cindex_max"] == max(
        r["val"]["cindex"] for r in records)
    assert [r["lr"] for r in records] == [3e-3, 3e-3]  # no scheduler
    best = torch.load(output / "fold0-seed0" / "best.pth", weights_only=True)
    assert best["model_config"]["num_classes"] == 4 and best["model_config"]["survival"]
    assert len(best["bin_edges"]) == 5
    capsys.readouterr()
    assert eval_main(["--checkpoint", str(output / "fold0-seed0" / "best.pth"), "--split", "val",
                      "--device", "cpu", "--no-progress"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["cindex"] == pytest.approx(summary["reported"]["cindex"], abs=1e-12)
    assert got["loss"] == pytest.approx(summary["reported"]["loss"], rel=1e-6)


def test_survival_holdout_selects_on_training_patients_and_reports_the_fold(survival_data,
                                                                            tmp_path):
    output = tmp_path / "surv_holdout"
    assert train_main(survival_args(survival_data, output, "--folds", "0",
                                    "--holdout-fraction", "0.25")) == 0
    summary = json.loads((output / "fold0-seed0" / "summary.json").read_text())
    assert summary["reported_split"] == "test" and summary["test_slides"] == 5
    assert summary["val_slides"] == 3 and summary["train_slides"] == 10  # 13 split 10 / 3
    assert summary["selection"] == "best val cindex"


# --- learning ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_2d_model_learns_a_tiny_easy_set():
    """Tumour square present (positive) or absent (negative: its cells turned normal) on tiny
    grids: through the training engine the 2D model's AUC rises from chance to ~1 in a few
    epochs. (The relational task itself is benchmarks/mil_synthetic.py's job: it needs ~1000 steps.)"""
    from vmamba2d.mil import MambaMIL2D, SlideRecord
    from vmamba2d.mil.engine import evaluate, train_one_epoch
    from vmamba2d.mil.synthetic import tumour_prototypes

    p0, p1 = tumour_prototypes(IN_DIM)
    records = []
    for s in make_synthetic_slides(24, min_size=8, max_size=12, in_dim=IN_DIM, seed=0):
        features = s.features.copy()
        if s.label == 0:
            tumour = ((features - p1) ** 2).sum(1) < ((features - p0) ** 2).sum(1)
            features[tumour] += (p0 - p1).astype(np.float32)
        coords = torch.from_numpy(s.coords // 512)
        records.append(SlideRecord(s.slide_id, torch.from_numpy(features), coords,
                                   (s.height, s.width), (0, 0), (512, 512), label=s.label))
    torch.manual_seed(0)
    model = MambaMIL2D(in_dim=IN_DIM, num_classes=2, dim=16, d_state=4, dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-5)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    common = dict(task="classification", alpha=0.0, device=torch.device("cpu"), amp="none",
                  workers=0, seed=0)
    before, _ = evaluate(model, records, num_classes=2, **common)
    losses = [train_one_epoch(model=model, dataset=records, order=np.random.default_rng(e)
                              .permutation(len(records)).tolist(), optimizer=optimizer,
                              scaler=scaler, epoch=e, progress=False, **common)["train_loss"]
              for e in range(4)]
    after, _ = evaluate(model, records, num_classes=2, **common)
    assert before["auc"] < 0.8 and after["auc"] >= 0.95
    assert losses[-1] < 0.5 * losses[0]


def test_a_diverged_run_stops_with_a_message_instead_of_a_traceback(dataset, tmp_path, capsys):
    argv = train_args(dataset, tmp_path / "run", epochs=2) + ["--lr", "1e30"]
    assert train_main(argv) == 1
    err = capsys.readouterr().err
    assert "mil/train.py: error: training loss is" in err and "--resume" in err
    assert "Traceback" not in err


def test_threads_option_is_restored_after_the_run(dataset, tmp_path):
    # --threads sets torch's intra-op threads for the run only: an in-process caller keeps its own.
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert train_main(train_args(dataset, tmp_path / "run", epochs=1) + ["--threads", "1"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_predictions_csv_is_replaced_atomically(tmp_path):
    path = tmp_path / "predictions.csv"
    runner.write_predictions(path, [{"slide_id": "a", "prob": 0.5}])
    before = path.read_text()
    with pytest.raises(ValueError):  # a row that does not fit the columns fails the write
        runner.write_predictions(path, [{"slide_id": "b", "prob": 0.1}, {"slide_id": "c", "x": 1}])
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["predictions.csv"]


def test_a_full_disk_stops_training_in_one_line_and_keeps_the_last_commit(dataset, tmp_path, capsys,
                                                                         monkeypatch):
    import errno

    from vmamba2d.runs import run_folder

    output = tmp_path / "run"
    save = run_folder.atomic_torch_save
    calls = []

    def full_after_the_first_epoch(obj, path):
        calls.append(path)
        if obj.get("epoch", 0) >= 1:  # the second epoch's best / last
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        save(obj, path)

    monkeypatch.setattr(run_folder, "atomic_torch_save", full_after_the_first_epoch)
    assert train_main(train_args(dataset, output, epochs=3)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(f"mil/train.py: error: cannot write into {output}: No space left on device"), line
    assert "intact" in line
    monkeypatch.undo()
    kept = torch.load(output / "seed3" / "last.pth", weights_only=True)
    assert kept["epoch"] == 0
    assert train_main(train_args(dataset, output, epochs=3) + ["--resume"]) == 0  # continues once there is room
