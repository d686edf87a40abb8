"""The byte account (vmamba2d.analysis.traffic, benchmarks/model_traffic.py): hand-computed counts on
small modules, properties of the models' accounts, and the mixed-precision traffic budget."""
from __future__ import annotations

import functools

import pytest
import timm
import torch
import torch.nn as nn

import vmamba2d  # noqa: F401  (registers the models)
from support.script_loading import load_benchmark
from vmamba2d.analysis.traffic import (
    TrafficAccount,
    TrafficCounter,
    account_model,
    format_account,
    roofline_seconds,
    tensor_bytes,
)


@functools.lru_cache(maxsize=None)
def model(name: str) -> nn.Module:
    """One seeded model per name for the whole module (the account does not change it)."""
    torch.manual_seed(0)
    return timm.create_model(name)


def account(name: str, mode: str, img_size: int = 64, batch: int = 1) -> TrafficAccount:
    return account_model(model(name), mode, img_size, batch)


def _traced(fn, *args):
    counter = TrafficCounter()
    with counter:
        fn(*args)
    return counter.records


# ---------------------------------------------------------------- counting rules, by hand


def test_two_ops_count_their_inputs_and_outputs_and_views_are_free():
    x = torch.randn(2, 3, 4, 5)  # 120 fp32 elements: 480 bytes

    def two_ops(t):
        y = (t * 2).view(2, -1).t().unsqueeze(0)  # mul: 480 read, 480 written; views free
        return y.to(torch.bfloat16)  # cast: 480 read, 240 written

    records = _traced(two_ops, x)
    assert [r.kind for r in records] == ["mul", "_to_copy"]
    assert [(r.read, r.written, r.cast) for r in records] == [(480, 480, False), (480, 240, True)]
    account = TrafficAccount(records, batch=2)
    assert account.total == 1680 and account.per_image == 840
    assert account.cast_bytes == 720 and account.cast_share == pytest.approx(720 / 1680)
    # a reshape that cannot be a view is a copy, and counted as one
    copies = _traced(lambda t: t.permute(0, 2, 3, 1).reshape(2, -1), x)
    assert [(r.kind, r.read, r.written) for r in copies] == [("clone", 480, 480)]


def test_in_place_out_and_copy_destinations():
    a, b, c = torch.ones(10), torch.ones(10), torch.empty(10)  # 40 bytes each
    records = _traced(lambda: (torch.add(a, b, out=c), a.add_(b), c.copy_(a), c.copy_(a.double())))
    # add.out: reads a, b, writes c; add_: reads a, b, writes a; copy_: reads a, writes c;
    # to(float64): 40 -> 80 (a cast); copy_ from float64: reads 80, writes 40 (a cast)
    assert [(r.kind, r.read, r.written, r.cast) for r in records] == [
        ("add", 80, 40, False), ("add_", 80, 40, False), ("copy_", 40, 40, False),
        ("_to_copy", 40, 80, True), ("copy_", 80, 40, True),
    ]


def test_broadcast_inputs_count_their_distinct_elements():
    assert tensor_bytes(torch.ones(3, 1).expand(3, 1000)) == 12
    records = _traced(lambda: torch.ones(4, 1000) + torch.ones(1000).expand(4, 1000))
    add = [r for r in records if r.kind == "add"][0]
    assert (add.read, add.written) == (16000 + 4000, 16000)


@pytest.mark.slow
def test_account_of_a_hand_built_module_on_fake_cuda():
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU())
    account = account_model(model, "fp32", img_size=4, batch=2)
    # conv: image 2*3*16*4 = 384, weight 8*3*4 = 96, bias 32 read; 2*8*16*4 = 1024 written; relu 1024 -> 1024
    assert [(r.kind, r.read, r.written) for r in account.records] == [("convolution", 512, 1024), ("relu", 1024, 1024)]
    assert {r.stage for r in account.records} == {"0", "1"}
    assert account.records[0].flops == 2 * 2 * 16 * 8 * 3 and account.records[0].compute == "tf32"
    bf16 = account_model(nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU()), "autocast-bf16", img_size=4, batch=2)
    casts = [(r.read, r.written) for r in bf16.records if r.cast]
    assert sorted(casts) == sorted([(32, 16), (96, 48), (384, 192)])  # bias, weight, image to bf16
    assert bf16.records[-1].kind == "relu" and bf16.records[-1].read == 512


def test_roofline_takes_the_slower_of_bytes_and_flops_per_op():
    account = account_model(nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU()), "fp32", img_size=4, batch=2)
    seconds = roofline_seconds(account, bandwidth=1000.0, peak_flops={"tf32": 1.0, "fp32": 1.0, "bf16": 1.0, "fp16": 1.0})
    assert seconds == pytest.approx(max(1536 / 1000.0, 1536.0) + 2048 / 1000.0)


# ---------------------------------------------------------------- the models' accounts


def test_scan_op_counted_by_its_formula():
    scans = [r for r in account("vmamba2d_tiny", "fp32").records if r.kind.startswith("scan:")]
    assert len(scans) == 14 and all(r.kind == "scan:cross_selective_scan_2d_fwd" for r in scans)
    # stage 0 at 64x64: a 16x16 map, Di = 96, K = 4 routes, R = 6, N = 1, fp32: u, the low-rank
    # delta, A, B, C, D, delta_bias and delta_proj_weight read once, y written once
    length, di, k, r, n = 256, 96, 4, 6, 1
    read = 4 * (di * length + k * r * length + k * di * n + 2 * k * n * length + 2 * k * di + k * di * r)
    first = [s for s in scans if s.stage == "stages.0"][0]
    assert (first.read, first.written) == (read, 4 * di * length)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vmamba2d_tiny", "convnext_tiny"])
def test_activation_bytes_scale_with_batch_and_pixels(name):
    def activations(img_size: int) -> tuple[float, float]:
        one, two, four = (account(name, "fp32", img_size, b).total for b in (1, 2, 4))
        return two - one, four - two

    small, small_twice = activations(64)
    assert small_twice == 2 * small  # linear in the batch: weights once, activations per image
    large, _ = activations(128)
    assert 3.9 * small < large <= 4.0 * small  # 4x the pixels (the pooled head is per image)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vmamba2d_tiny", "convnext_tiny"])
def test_casts_counted_only_where_dtypes_change(name):
    net = model(name)
    assert account(name, "fp32").cast_bytes == 0
    # bf16 weights and inputs: only SS2D's small scan parameters are cast (to fp32, 2 bytes read, 4 written)
    scan_parameters = sum(p.numel() for n, p in net.named_parameters() if n.endswith(("A_logs", "Ds", "dt_projs_bias")))
    assert account(name, "bf16").cast_bytes == 6 * scan_parameters
    autocast = account(name, "autocast-bf16")
    # autocast casts every convolution / linear weight to bf16 at least once: 4 bytes read, 2 written
    gemm_weights = sum(m.weight.numel() for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    assert autocast.cast_bytes >= 6 * gemm_weights
    assert autocast.cast_bytes == sum(r.total for r in autocast.records if r.kind in ("_to_copy", "copy_") and r.cast)


def test_tool_prints_and_writes_the_tables(tmp_path, capsys):
    tool = load_benchmark("model_traffic")
    out = tmp_path / "traffic.md"
    assert tool.main(["--model", "vmamba2d_tiny", "--dtype", "autocast-bf16", "--img-size", "64", "--batch", "1",
                      "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed.rstrip("\n") + "\n"
    for needle in ("MiB per image", "dtype casts", "roofline estimate (not a measurement)", "| stages.2 |",
                   "| scan:cross_selective_scan_2d_fwd |", "| convolution |"):
        assert needle in printed
    with pytest.raises(SystemExit):
        tool.main(["--model", "vmamba2d_tiny", "--batch", "0"])
    with pytest.raises(SystemExit):
        tool.main(["--model", "vmamba2d_tiny", "--peak-tflops", "int8=1"])


def test_format_account_lists_every_stage():
    text = format_account(account("convnext_tiny", "bf16"), "convnext_tiny")
    assert all(f"| stages.{i} |" in text for i in range(4)) and "| stem |" in text


# ---------------------------------------------------------------- the mixed-precision budget

# Issue 41: in bf16 (weights and inputs) and in bf16 autocast, vmamba2d_tiny moves at most 1.2x
# ConvNeXt-T's bytes per image, and dtype casts are at most 2% of its bytes. Measured at the H200
# benchmark's setting (224 x 224, batch 128: weights and their casts are per batch).
BUDGET_RATIO = 1.2
BUDGET_CAST_SHARE = 0.02


@pytest.mark.parametrize("mode", ["bf16", "autocast-bf16"])
def test_traffic_budget_against_convnext(mode):
    ours = account("vmamba2d_tiny", mode, 224, 128)
    convnext = account("convnext_tiny", mode, 224, 128)
    ratio = ours.per_image / convnext.per_image
    assert ratio <= BUDGET_RATIO, f"{mode}: {ratio:.3f}x ConvNeXt-T's bytes per image"
    assert ours.cast_share <= BUDGET_CAST_SHARE, f"{mode}: casts {100 * ours.cast_share:.2f}% of the bytes"


def test_autocast_casts_no_map_but_the_image():
    """Under CUDA autocast the norms return bf16 and the residual stream stays bf16, so no map is
    cast: the cast bytes that grow with the batch (the weights' casts do not) are the image's
    one cast to bf16 in the stem."""
    one, two = (account("vmamba2d_tiny", "autocast-bf16", 64, batch) for batch in (1, 2))
    assert two.cast_bytes - one.cast_bytes == 3 * 64 * 64 * (4 + 2)
