"""benchmarks/bench_scan.py (the CPU benchmark): its naive baseline, a tiny run, the hand-over to the GPU
benchmark (dev/gpu/bench_scan_cuda.py, whose own tests are in dev/gpu/tests/)."""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops import selective_scan_2d

from support.script_loading import load_benchmark


def _load_bench():
    return load_benchmark("bench_scan")


def test_naive_baseline_matches_the_reference_backend():
    bench = _load_bench()
    gen = torch.Generator().manual_seed(0)
    batch, dim, groups, nstate, height, width = 2, 4, 2, 3, 5, 7
    length = height * width
    inputs = dict(
        u=torch.randn(batch, dim, length, generator=gen, dtype=torch.float64),
        delta=torch.randn(batch, dim, length, generator=gen, dtype=torch.float64),
        A=-torch.rand(dim, nstate, generator=gen, dtype=torch.float64) - 0.2,
        B=torch.randn(batch, groups, nstate, length, generator=gen, dtype=torch.float64),
        C=torch.randn(batch, groups, nstate, length, generator=gen, dtype=torch.float64),
        D=torch.randn(dim, generator=gen, dtype=torch.float64),
        delta_bias=torch.randn(dim, generator=gen, dtype=torch.float64),
    )
    naive = bench.naive_scan_2d(**inputs, delta_softplus=True, height=height, width=width)
    expected = selective_scan_2d(**inputs, height=height, width=width, backend="reference")
    torch.testing.assert_close(naive, expected, rtol=1e-10, atol=1e-10)


def test_tiny_benchmark_run_writes_a_table(tmp_path, capsys):
    bench = _load_bench()
    out = tmp_path / "scan.md"
    bench.main(["--sizes", "6", "--settings", "table3", "--table3-batch", "2", "--repeats", "1",
                "--out", str(out)])
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| table3 | 6×6 |")]
    assert [row.split("|")[3].strip() for row in rows] == ["cpu", "torch", "naive"]
    for row in rows:
        fwd_ms, train_ms, cpu_ms, maps_per_s, peak_fwd, peak_train = (
            float(c.strip().replace(",", "")) for c in row.split("|")[4:10])
        assert fwd_ms > 0 and train_ms > 0 and cpu_ms >= 0 and maps_per_s > 0, row
        assert peak_train > 0 and peak_fwd >= 0, row
    assert "commit:" in text and "machine:" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_scan_device_cuda_without_a_gpu_says_so():
    bench = _load_bench()
    with pytest.raises(SystemExit, match="no CUDA device"):
        bench.main(["--device", "cuda"])
