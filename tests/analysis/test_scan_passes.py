"""The CUDA four-route forward's passes (vmamba2d.analysis.scan_passes) and the byte account's
``scan_traffic="cuda"`` view: hand-computed bytes per pass, the design each shape takes, and a
ratchet on what the CUDA path moves for vmamba2d_tiny."""
from __future__ import annotations

import pytest
import timm
import torch

import vmamba2d  # noqa: F401  (registers the models)
from vmamba2d.analysis.scan_passes import cuda_cross_design, cuda_cross_forward_passes
from vmamba2d.analysis.traffic import account_model
from vmamba2d.ops import CROSS_ROUTES

CROSS = [route.code for route in CROSS_ROUTES]


def _inputs(height: int, width: int, dtype: torch.dtype, channels_last: bool, rank=None, batch=2, dim=8):
    """Meta tensors of one four-route call: u (batch, dim, H, W), delta full-rank or low-rank."""
    def meta(*shape, dt=dtype):
        return torch.empty(*shape, dtype=dt, device="meta")
    u = meta(batch, dim, height, width)
    if channels_last:
        u = u.contiguous(memory_format=torch.channels_last)
    delta = meta(batch, 4, rank or dim, height, width)
    weight = meta(4, dim, rank) if rank else None
    small = meta(4 * dim, dt=torch.float32)
    return dict(u=u, delta=delta, A=meta(4 * dim, 1, dt=torch.float32), B=meta(batch, 4, 1, height, width),
                C=meta(batch, 4, 1, height, width), D=small, delta_bias=small, routes=CROSS, out_fp32=False,
                delta_proj_weight=weight)


def test_rs_passes_of_a_channels_last_bf16_call_by_hand():
    batch, dim, h, w, rank = 2, 8, 56, 56, 3
    passes = cuda_cross_forward_passes(**_inputs(h, w, torch.bfloat16, True, rank))
    cells = batch * dim * h * w
    full = 2 * batch * 4 * dim * h * w
    low = 2 * batch * 4 * rank * h * w
    bc = 2 * batch * 4 * h * w
    small = 4 * (4 * dim) * 3
    assert [(p.name, p.read, p.written) for p in passes] == [
        ("u-copy", 2 * cells, 2 * cells),
        ("delta-projection", low + 2 * 4 * dim * rank, full),
        # two sweeps read u twice; y written by both, read back by the second
        ("kernel", 2 * 2 * cells + full + 2 * bc + small + 2 * cells, 2 * 2 * cells),
        ("y-copy", 2 * cells, 2 * cells),
    ]


def test_a_rank_the_rule_folds_has_no_projection_pass():
    batch, dim, h, w, rank = 2, 8, 28, 28, 1  # fp32 R = 1 at W = 28: the fold rule folds it
    args = _inputs(h, w, torch.float32, False, rank)
    args["delta_proj_weight"] = args["delta_proj_weight"].float()
    passes = cuda_cross_forward_passes(**args)
    cells = batch * dim * h * w
    low = 4 * batch * 4 * rank * h * w
    bc = 4 * batch * 4 * h * w
    small = 4 * (4 * dim) * 3 + 4 * 4 * dim * rank  # A, D, delta_bias; the weight
    assert [(p.name, p.read, p.written) for p in passes] == [
        ("kernel", 2 * 4 * cells + low + 2 * bc + small + 4 * cells, 2 * 4 * cells)]


def test_model_ranks_are_projected_first():
    args = _inputs(56, 56, torch.bfloat16, True, rank=6)
    args["delta_proj_weight"] = args["delta_proj_weight"].float()
    assert "delta-projection" in [p.name for p in cuda_cross_forward_passes(**args)]


def test_contiguous_full_rank_call_has_only_the_kernel():
    passes = cuda_cross_forward_passes(**_inputs(28, 28, torch.float32, False))
    assert [p.name for p in passes] == ["kernel"]


def test_wide_maps_take_v3_one_launch_per_route_with_an_fp32_y_and_a_cast():
    batch, dim, h, w = 2, 8, 9, 132  # 132 columns: wider than the four-route RS kernel's 128 (bf16)
    args = _inputs(h, w, torch.bfloat16, False)
    assert cuda_cross_design(args["u"], args["B"], CROSS, False) == "v3"
    passes = cuda_cross_forward_passes(**args)
    cells = batch * dim * h * w
    full = 2 * batch * 4 * dim * h * w
    bc = 2 * batch * 4 * h * w
    small = 4 * (4 * dim) * 3
    assert [(p.name, p.read, p.written) for p in passes] == [
        ("kernel", 4 * 2 * cells + full + 2 * bc + small + 3 * 4 * cells, 4 * 4 * cells),
        ("y-cast", 4 * cells, 2 * cells),
    ]


@pytest.mark.parametrize("size, design", [(56, "rs"), (28, "rs"), (14, "rs"), (7, "rs"), (65, "v3")])
def test_design_follows_the_rule(size, design):
    args = _inputs(size, size, torch.bfloat16, True)
    assert cuda_cross_design(args["u"], args["B"], CROSS, False) == design


def test_corner_routes_take_v3():
    args = _inputs(14, 14, torch.float32, False)
    assert cuda_cross_design(args["u"], args["B"], [0, 1, 2, 3], False) == "v3"


def _tiny():
    torch.manual_seed(0)
    return timm.create_model("vmamba2d_tiny")


def test_cuda_view_adds_the_passes_to_the_fused_count():
    model = _tiny()
    fused = account_model(model, "bf16", 64, 1)
    cuda = account_model(model, "bf16", 64, 1, scan_traffic="cuda")
    scans = {r.kind for r in cuda.records if r.kind.startswith("scan:")}
    op = "scan:cross_selective_scan_2d_fwd"
    assert scans == {f"{op}:{name}" for name in ("u-copy", "delta-projection", "kernel", "y-copy")}
    others = lambda account: sum(r.total for r in account.records if not r.kind.startswith("scan:"))  # noqa: E731
    assert others(cuda) == others(fused)
    assert cuda.total > fused.total


def test_scan_traffic_must_be_a_known_view():
    with pytest.raises(ValueError, match="scan_traffic"):
        account_model(torch.nn.Identity(), "fp32", 4, 1, scan_traffic="ideal")


# What the CUDA path moves for vmamba2d_tiny in bf16 at 224 x 224, batch 128 (MiB per image), as
# counted at 1e1271b: 185.42 (the fused count: 140.20). It may only go down; lower it when a pass
# goes (benchmarks/model_traffic_cuda.md).
CUDA_PATH_MIB_PER_IMAGE = 185.42


def test_cuda_path_bytes_do_not_grow():
    account = account_model(_tiny(), "bf16", 224, 128, scan_traffic="cuda")
    assert account.per_image / 2**20 <= CUDA_PATH_MIB_PER_IMAGE + 0.01
