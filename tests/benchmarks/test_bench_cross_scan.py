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
