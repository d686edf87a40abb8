"""benchmarks/bench_model.py: model specs, the fused-route targets, the byte account's estimates
beside GPU rows, and real (tiny) runs: profiled, and eager beside torch.compile."""
from __future__ import annotations

import pytest

from support.script_loading import load_benchmark


def _tool():
    return load_benchmark("bench_model")


def test_model_specs():
    tool = _tool()
    assert tool.parse_model_spec("vmamba2d_tiny") == ("vmamba2d_tiny", {})
    assert tool.parse_model_spec("vmamba2d_tiny:cross_scan=per_route,d_state=2") == (
        "vmamba2d_tiny", {"cross_scan": "per_route", "d_state": 2})
    with pytest.raises(ValueError, match="key=value"):
        tool.parse_model_spec("vmamba2d_tiny:per_route")


def test_fused_route_targets_compare_matching_rows():
    tool = _tool()
    row = lambda model, batch, infer, train, mem: dict(  # noqa: E731
        model=model, precision="fp32", batch=batch, infer_img_s=infer, train_img_s=train,
        infer_peak_mb=mem, train_peak_mb=mem)
    rows = [row("vmamba2d_tiny", 8, 13.0, 3.0, 900), row("vmamba2d_tiny:cross_scan=per_route", 8, 10.0, 2.0, 1000),
            row("convnext_tiny", 8, 14.0, 4.0, 800)]
    lines = tool._fused_route_targets(rows, "cpu")
    assert "fused / per-route inference = 1.30x (target >= 1.3x): met" in lines[0]
    assert "fused / per-route training = 1.50x (target >= 1.2x): met" in lines[1]
    assert all("met" in line for line in lines[2:4]) and "NOT" not in lines[2]
    assert lines[4].endswith("vmamba2d_tiny / convnext_tiny inference = 0.93x (target >= 1.0x): NOT met")


@pytest.mark.slow
def test_profiled_run_reports_route_copy_share(tmp_path, capsys):
    tool = _tool()
    out = tmp_path / "bench.md"
    assert tool.main(["--models", "vmamba2d_tiny:cross_scan=per_route", "--batch-sizes", "1", "--iters", "1",
                      "--warmup", "0", "--img-size", "64", "--no-train", "--profile", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| vmamba2d_tiny:cross_scan=per_route | fp32 | 1 |" in text
    assert "route-copy operators (aten::copy_, aten::flip, aten::cat, aten::stack):" in text


@pytest.mark.slow
def test_account_estimates_count_the_cuda_path_passes_of_the_scan_only():
    tool = _tool()
    fused, cuda = tool.account_estimates("vmamba2d_tiny", "bf16", 2, 64)
    assert 0 < cuda < fused  # the CUDA path moves more bytes than a fused scan: slower estimate
    fused, cuda = tool.account_estimates("convnext_tiny [torch.compile]", "fp32", 2, 64)
    assert 0 < cuda == fused  # no scan op


def test_table_puts_the_estimate_beside_the_measurement():
    tool = _tool()
    rows = [dict(model="vmamba2d_tiny", precision="bf16", batch=128, infer_img_s=3000.0, infer_peak_mb=5000.0,
                 account_img_s=(27126.4, 20767.2)),
            dict(model="x", precision="bf16", batch=128, infer_img_s=10.0, infer_peak_mb=1.0)]
    lines = tool._table(rows)
    assert lines[0].endswith("| account roofline img/s, fused / CUDA path (estimate) |")
    assert lines[2].endswith("| 3000.00 | - | 5000 | - | 27,126 / 20,767 |")
    assert lines[3].endswith("| - |")
    assert "account" not in tool._table(rows[1:])[0]  # CPU rows: no estimate column


@pytest.mark.slow
def test_compile_both_gives_eager_and_compiled_rows(tmp_path):
    tool = _tool()
    out = tmp_path / "bench.md"
    assert tool.main(["--models", "test_resnet", "--batch-sizes", "1", "--iters", "1", "--warmup", "0",
                      "--img-size", "64", "--no-train", "--compile", "both", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| test_resnet | fp32 | 1 |" in text and "| test_resnet [torch.compile] | fp32 | 1 |" in text
