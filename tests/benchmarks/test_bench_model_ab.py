"""benchmarks/bench_model_ab.py: paired statistics, the alternating call order, a real (tiny) run and a
failing worker."""
from __future__ import annotations

import pytest

from support.script_loading import load_benchmark


def _tool():
    return load_benchmark("bench_model_ab")


def test_summary_is_the_median_of_per_round_ratios():
    tool = _tool()
    # A drifts 5x slower over the rounds; B is 1.5x A within every round but one (1.2x), which
    # lands in the middle of B's times: the ratio of the two medians would be 1.2x.
    walls_a = [1.0, 2.0, 3.0, 4.0, 5.0]
    ratios = [1.5, 1.5, 1.2, 1.5, 1.5]
    result = tool.summarize([(a, a / 2) for a in walls_a], [(a * r, a) for a, r in zip(walls_a, ratios)])
    assert result.ratio == pytest.approx(1.5)
    assert result.ratio_quartiles == (pytest.approx(1.5), pytest.approx(1.5))
    assert result.cpu_ratio == pytest.approx(2.0)
    assert result.wall_a == pytest.approx(3.0) and result.wall_b == pytest.approx(3.6)
    assert result.rounds == 5
    with pytest.raises(ValueError, match="one .* pair of A and of B per round"):
        tool.summarize([(1.0, 1.0)], [])


def test_turns_alternate_and_only_their_last_calls_count(monkeypatch):
    tool = _tool()
    calls, mallocs = [], []

    class FakeWorker:
        def __init__(self, spec, phase, batch, args, malloc):
            self.spec, self.count = spec, 0
            mallocs.append((spec, malloc))

        def call(self):
            self.count += 1
            calls.append(self.spec)
            return (self.count * (2.0 if self.spec == "B" else 1.0), 1.0)

        def close(self):
            return {"A": 10.0, "B": 20.0}[self.spec]

        def kill(self):
            raise AssertionError("no failure here")

    monkeypatch.setattr(tool, "Worker", FakeWorker)
    args = tool.argparse.Namespace(a="A", b="B", warmup=1, rounds=3, rewarm=1, start_order="a-first",
                                   malloc="keep", malloc_b="default")
    result, peak_a, peak_b = tool.measure_pair("infer", 1, args)
    assert mallocs == [("A", "keep"), ("B", "default")]
    assert "".join(calls) == "AABB" + "BBAA" + "AABB" + "BBAA"
    # The first round warms up; each turn's second call counts: calls 4, 6, 8 of each worker,
    # A 4, 6, 8 s and B 8, 12, 16 s.
    assert result.ratio == pytest.approx(2.0) and result.wall_a == pytest.approx(6.0)
    assert (peak_a, peak_b) == (10.0, 20.0)


@pytest.mark.slow
def test_tiny_run_writes_the_table(tmp_path):
    tool = _tool()
    out = tmp_path / "ab.md"
    assert tool.main(["vmamba2d_tiny", "vmamba2d_tiny:cross_scan=per_route", "--batch-sizes", "1", "--rounds", "2",
                      "--warmup", "0", "--rewarm", "0", "--img-size", "64", "--target", "0.01", "--out",
                      str(out)]) == 0
    text = out.read_text()
    assert "- A: `vmamba2d_tiny`; B: `vmamba2d_tiny:cross_scan=per_route`; fp32, input 64x64" in text
    assert "- CPU malloc: freed memory kept for reuse" in text
    row = next(line for line in text.splitlines() if line.startswith("| infer | 1 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[4].rstrip("x")) > 0
    assert float(cells[7]) > 100 and float(cells[8]) > 100  # peak RSS of a worker with torch loaded, MiB
    assert cells[9] == ">= 0.01x: met"


@pytest.mark.slow
def test_a_failing_worker_reports_its_error():
    tool = _tool()
    with pytest.raises(RuntimeError, match="worker for no_such_model exited with code 1"):
        tool.main(["no_such_model", "vmamba2d_tiny", "--batch-sizes", "1", "--rounds", "1", "--img-size", "64"])


def test_bad_arguments_are_named():
    tool = _tool()
    with pytest.raises(SystemExit):
        tool.main(["vmamba2d_tiny:per_route"])
    for bad in (["--rounds", "0"], ["--rewarm", "-1"]):
        with pytest.raises(SystemExit):
            tool.main(bad)


def test_both_start_orders_split_the_rounds(monkeypatch):
    """--start-order both: a first pair with A's worker started first, then a fresh pair with B's,
    the rounds split between them (the odd one to the first) and pooled; peaks the largest."""
    tool = _tool()
    started = []

    class FakeWorker:
        def __init__(self, spec, phase, batch, args, malloc):
            assert malloc == "keep"  # --malloc-b unset: B's as A's
            self.spec, self.pair = spec, len(started) // 2
            started.append(spec)

        def call(self):
            # pair 0: B takes 2 s, pair 1: 3 s; A always 1 s
            return ((2.0 + self.pair) if self.spec == "B" else 1.0, 1.0)

        def close(self):
            return {"A": 10.0, "B": 20.0}[self.spec] + self.pair

        def kill(self):
            raise AssertionError("no failure here")

    monkeypatch.setattr(tool, "Worker", FakeWorker)
    args = tool.argparse.Namespace(a="A", b="B", warmup=0, rounds=5, rewarm=0, start_order="both",
                                   malloc="keep", malloc_b=None)
    result, peak_a, peak_b = tool.measure_pair("train", 8, args)
    assert started == ["A", "B", "B", "A"]
    assert result.rounds == 5
    # 3 rounds at ratio 2 (first pair), 2 at ratio 3: the median is 2
    assert result.ratio == pytest.approx(2.0) and result.ratio_quartiles[1] == pytest.approx(3.0)
    assert (peak_a, peak_b) == (11.0, 21.0)


def test_the_malloc_setting_of_each_worker_is_in_the_header():
    tool = _tool()
    same = tool.argparse.Namespace(malloc="default", malloc_b=None)
    assert tool._malloc_lines(same) == ["- CPU malloc: the C library's defaults (glibc: large blocks mapped "
                                        "afresh and unmapped when freed)"]
    lines = tool._malloc_lines(tool.argparse.Namespace(malloc="keep", malloc_b="default"))
    assert lines[0].startswith("- CPU malloc of A: freed memory kept") and lines[1].startswith("- CPU malloc of B: the C")
    with pytest.raises(ValueError, match="malloc setting must be one of"):
        tool.bench_model.apply_malloc_setting("tcmalloc")
