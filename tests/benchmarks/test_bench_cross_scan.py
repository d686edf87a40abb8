"""benchmarks/bench_cross_scan.py runs both paths on real inputs and writes its table."""
from __future__ import annotations

from support.script_loading import load_benchmark


def test_cross_scan_benchmark_writes_a_row_per_backend_scan_and_stage(tmp_path):
    tool = load_benchmark("bench_cross_scan")
    out = tmp_path / "cross.md"
    assert tool.main(["--backends", "cpu", "torch", "--stages", "3", "--batch", "1", "--repeats", "1",
                      "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| cpu") or line.startswith("| torch")]
    assert [row.split(" | ")[:3] for row in rows] == [
        ["| cpu", "2d", "7x7"], ["| cpu", "1d", "7x7"], ["| torch", "2d", "7x7"], ["| torch", "1d", "7x7"]]
    header = next(line for line in out.read_text().splitlines() if line.startswith("| backend"))
    assert header.rstrip(" |").endswith("fwd fused ms back to back")
    assert all(float(row.rstrip(" |").rsplit(" | ", 1)[1]) > 0 for row in rows)  # the back-to-back forward


def test_back_to_back_calls_each_step_once_per_call_after_a_warm_up():
    tool = load_benchmark("bench_cross_scan")
    calls = []
    assert tool.time_back_to_back(lambda: calls.append(1), 5, "cpu") >= 0
    assert len(calls) == 6
