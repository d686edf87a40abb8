"""The four-route kernel with folded step sizes on the NVRTC path without a GPU: the rule deciding
whether the kernel projects the low-rank step sizes itself (rows_plan.fold_rule), the design the CUDA
four-route op gets with a projection, the launch's grid, block and parameter block (RowsFoldParams,
recording fake driver), the op's choice between folding and projecting first, and the folding entry
compiling with NVRTC within the launch bounds' registers without spills."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from support.rows_cases import assert_cross_params, cross_fold_inputs
from vmamba2d.ops import CROSS_ROUTES, plan as scan_plan
from vmamba2d.ops.compiled import cross_ops, cross_rows_launch, nvrtc, rows_launch, rows_plan
from vmamba2d.ops.compiled.cuda_kernels import KERNELS, MODEL_FOLD_RANKS, MODEL_MAP_SIDES, rows_cross_kernel

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

from support.nvrtc_recording import recording_launcher, stub_kernel  # noqa: E402

CODES = [route.code for route in CROSS_ROUTES]
ORDER = ("u", "delta", "A", "B", "C", "D", "delta_bias")


def args(x):
    return [x[n] for n in ORDER]


def test_rule_folds_where_the_added_instructions_fit_the_projection_pass():
    # The budget: the issue time (H200: 132 SMs x 4 x 32 lanes x 1.98 GHz) of the 4 routes' full-rank delta
    # the projection writes (2 or 4 bytes each) at 4.2 TB/s.
    balance = 132 * 4 * 32 * 1.98e9 / 4.2e12
    assert rows_plan.fold_budget(2) == pytest.approx(balance * 8)
    assert rows_plan.fold_budget(4) == pytest.approx(balance * 16)
    for (dtype, width), (plain, at_one, per_two) in rows_plan.CROSS_FOLD_SASS.items():
        budget = rows_plan.fold_budget(4 if dtype == "fp32" else 2)
        for rank in range(1, 70):
            extra = at_one - plain + per_two * (rank // 2)
            assert rows_plan.fold_extra_sass(dtype, width, rank) == pytest.approx(extra)
            folds, why = rows_plan.fold_rule(dtype, width, rank, width * width)
            assert folds == (extra <= budget), (dtype, width, rank)
            assert why.startswith("step sizes folded" if folds else "step sizes projected first")
            assert f"R = {rank}" in why and "estimate" in why
    # what that gives with the committed figures: fp32 up to R = 3 at W = 56, 5 at 28 / 14, 1 at 7; the
    # 2-byte types R = 1 except at 7 x 7 -- no model rank (6 .. 64) folds
    assert [max((r for r in range(1, 70) if rows_plan.fold_rule("fp32", w, r, w * w)[0]), default=0)
            for w in (56, 28, 14, 7)] == [3, 5, 5, 1]
    assert [max((r for r in range(1, 70) if rows_plan.fold_rule("bf16", w, r, w * w)[0]), default=0)
            for w in (56, 28, 14, 7)] == [1, 1, 1, 0]
    # a width without figures takes its type's largest cost; 32-bit offsets cap 4 R H W
    assert rows_plan.fold_extra_sass("fp32", 9, 3) == max(rows_plan.fold_extra_sass("fp32", w, 3)
                                                         for w in MODEL_MAP_SIDES)
    assert rows_plan.fold_rule("fp32", 56, 1, 2**29) == (
        False, "step sizes projected first (4 * R * H * W >= 2^31: the folding kernel's offsets are 32-bit)")
    with pytest.raises(ValueError, match="rank"):
        rows_plan.fold_rule("fp32", 56, 0, 3136)
    with pytest.raises(ValueError, match="dtype"):
        rows_plan.fold_extra_sass("fp64", 56, 1)


def test_design_names_the_fold_decision(monkeypatch):
    x = cross_fold_inputs(2, 8, 56, 56, 3, torch.float32, seed=0)
    design, plan, why = cross_rows_launch.cross_forward_design(*args(x), CODES, False, x["delta_proj_weight"])
    assert design == "rs" and plan == dataclasses.replace(rows_plan.cross_plan(4, 4, 56), fold=True)
    assert why.startswith("RS: N = 1, width 56 <= 64; step sizes folded (R = 3:")
    assert cross_rows_launch.folds(*args(x), CODES, False, x["delta_proj_weight"])
    # a model rank: projected first, the plan's fold False
    x = cross_fold_inputs(2, 8, 56, 56, 6, torch.bfloat16, seed=0)
    design, plan, why = cross_rows_launch.cross_forward_design(*args(x), CODES, False, x["delta_proj_weight"])
    assert design == "rs" and not plan.fold and "step sizes projected first (R = 6:" in why
    # a weight the folding entry cannot read, a call v3 runs, the v3 pin: projected first
    x = cross_fold_inputs(1, 4, 14, 14, 1, torch.float32, seed=1)
    design, plan, why = cross_rows_launch.cross_forward_design(*args(x), CODES, False,
                                                              x["delta_proj_weight"].double())
    assert not plan.fold and "delta_proj_weight torch.float64" in why
    # the op passes the weight in the inputs' type on CUDA: the folding entry widens it
    assert cross_rows_launch.folds(*args(x), CODES, False, x["delta_proj_weight"].to(torch.bfloat16))
    design, _, why = cross_rows_launch.cross_forward_design(*args(x), [0, 4, 3, 6], False, x["delta_proj_weight"])
    assert design == "v3" and why.endswith("; step sizes projected first")
    monkeypatch.setenv(rows_launch.PLAN_ENV, "v3")
    assert cross_rows_launch.cross_forward_design(*args(x), CODES, False, x["delta_proj_weight"]) == (
        "v3", None, "VMAMBA2D_SCAN_PLAN=v3; step sizes projected first")
    assert not cross_rows_launch.folds(*args(x), CODES, False, x["delta_proj_weight"])


def test_debug_env_prints_the_fold_decision(monkeypatch, capsys):
    monkeypatch.setenv(scan_plan.DEBUG_ENV, "1")
    x = cross_fold_inputs(1, 4, 13, 14, 3, torch.float32, seed=2)  # a shape no other test prints
    cross_rows_launch.cross_forward_design(*args(x), CODES, False, x["delta_proj_weight"])
    assert "vmamba2d plan: cuda four-route step sizes folded (R = 3:" in capsys.readouterr().err
    assert "cuda_four_route_fold" in scan_plan.describe()


def test_bad_weight_or_delta_shapes_are_named():
    x = cross_fold_inputs(1, 4, 14, 14, 3, torch.float32, seed=3)
    with pytest.raises(ValueError, match=r"delta_proj_weight: expected \(4, dim, R\) with dim = 4"):
        cross_rows_launch.cross_forward_design(*args(x), CODES, False, torch.zeros(4, 5, 3))
    with pytest.raises(ValueError, match=r"delta: with delta_proj_weight, expected the low-rank \(batch, 4, R, H, W\)"):
        cross_rows_launch.cross_forward_design(*args(x), CODES, False, torch.zeros(4, 4, 2))




@pytest.fixture()
def launcher(tmp_path):
    launcher, driver = recording_launcher(tmp_path, TOOLCHAIN)
    return launcher, driver, tmp_path


@pytest.mark.parametrize("dtype,side,rank,out_fp32,channels_last", [
    (torch.float32, 56, 3, False, False), (torch.float32, 14, 3, True, True), (torch.bfloat16, 28, 1, False, False),
    (torch.float16, 14, 1, True, False)])
def test_launch_passes_the_fold_parameter_block(launcher, dtype, side, rank, out_fp32, channels_last):
    launcher, driver, folder = launcher
    batch, dim = 3, 10
    x = cross_fold_inputs(batch, dim, side, side, rank, dtype, seed=side + rank)
    if channels_last:
        x["u"] = x["u"].contiguous(memory_format=torch.channels_last)
    weight = x["delta_proj_weight"]
    design, plan, _ = cross_rows_launch.cross_forward_design(*args(x), CODES, out_fp32, weight)
    assert design == "rs" and plan.fold
    spec = cross_rows_launch.plan_spec(plan, dtype)
    assert spec == rows_cross_kernel({torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype],
                                     plan.vec, plan.load, plan.scan_steps, fold=True, min_blocks=plan.min_blocks)
    assert spec.name.endswith("f") and ("VMAMBA2D_RS_FOLD", "1") in spec.defines
    # bf16 at 28: 4 columns a lane, the entry compiled for 6 blocks per SM as the unfolded one
    assert (plan.vec, plan.min_blocks) == ((4, 6) if (dtype, side) == (torch.bfloat16, 28) else (plan.vec, 8))
    assert (("VMAMBA2D_RS_MIN_BLOCKS", "6") in spec.defines) == (plan.min_blocks == 6)
    stub_kernel(folder, spec, TOOLCHAIN)
    seen = driver.read_params(cross_rows_launch.RowsFoldParams)
    y = cross_rows_launch.launch_forward(launcher, *args(x), True, CODES, out_fp32, weight)
    assert y.shape == x["u"].shape and y.dtype == (torch.float32 if out_fp32 else dtype)
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{spec.file_stem}"
    assert launch[2:6] == ((plan.blocks(batch, dim), 1, 1), 128, 0, 1000)
    ((p,),) = seen
    assert (p.delta_proj, p.rank) == (weight.data_ptr(), rank)  # fp32 contiguous: read in place
    inputs = tuple(x[n] for n in ("delta", "B", "C", "A", "D", "delta_bias"))
    assert_cross_params(p.rows, plan, inputs, batch, dim, side, 4 * rank, y)


def test_launch_widens_a_weight_of_the_inputs_type(launcher):
    # On CUDA the op passes delta_proj_weight in the inputs' type (as project_delta takes it): the launch
    # hands the kernel an fp32 copy of it (exact), not the 2-byte tensor.
    launcher, driver, folder = launcher
    x = cross_fold_inputs(2, 4, 14, 14, 1, torch.bfloat16, seed=9)
    weight = x["delta_proj_weight"].to(torch.bfloat16)
    _, plan, _ = cross_rows_launch.cross_forward_design(*args(x), CODES, False, weight)
    stub_kernel(folder, cross_rows_launch.plan_spec(plan, torch.bfloat16), TOOLCHAIN)
    seen = driver.read_params(cross_rows_launch.RowsFoldParams)
    cross_rows_launch.launch_forward(launcher, *args(x), True, CODES, False, weight)
    ((p,),) = seen
    assert p.rank == 1 and p.delta_proj not in (0, None, weight.data_ptr())


def test_launch_refuses_a_projection_the_rule_does_not_fold(launcher):
    launcher, driver, _ = launcher
    x = cross_fold_inputs(2, 4, 56, 56, 6, torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match=r"delta_proj_weight: the folding kernel does not take this call \(RS: .*"
                                         r"step sizes projected first \(R = 6"):
        cross_rows_launch.launch_forward(launcher, *args(x), True, CODES, False, x["delta_proj_weight"])
    _, plan, _ = cross_rows_launch.cross_forward_design(*args(x), CODES, False, x["delta_proj_weight"])
    with pytest.raises(ValueError, match="delta_proj_weight: a full-rank plan takes no step-size projection"):
        cross_rows_launch.cross_params(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["delta_bias"],
                                       x["u"], True, plan, x["delta_proj_weight"])
    assert driver.of("launch") == []


class _NvccModule:
    """A kernel module with the nvcc extension's interface (no cross_folds), recording what the op passes."""

    def __init__(self):
        self.calls = []

    def cross_forward(self, u, delta, *rest):
        self.calls.append((tuple(delta.shape), len(rest)))
        return torch.zeros_like(u)


class _NvrtcModule(_NvccModule):
    """The NVRTC backend's interface: cross_folds answers by the rule (cross_rows_launch.folds)."""

    def cross_folds(self, *a):
        return cross_rows_launch.folds(*a)


@pytest.mark.parametrize("rank,folds", [(2, True), (6, False)])
def test_op_passes_the_weight_only_where_the_kernel_folds(monkeypatch, rank, folds):
    # cross_ops asks the module whether its forward folds this call (cuda: the rule) and otherwise
    # projects first; the nvcc extension has no cross_folds and always gets the projected delta.
    x = cross_fold_inputs(2, 3, 28, 28, rank, torch.float32, seed=5)
    monkeypatch.setattr(cross_ops, "_kernel_projects", lambda u: False)  # as on a CUDA device
    for module, passes in ((_NvrtcModule(), folds), (_NvccModule(), False)):
        monkeypatch.setattr(cross_ops, "kernel_module", lambda device: module)
        cross_ops.cross_selective_scan_2d_fwd(*args(x), True, CODES, False, x["delta_proj_weight"])
        # the low-rank delta and the weight (10 arguments after delta), or the projected delta (9)
        assert module.calls == ([((2, 4, rank, 28, 28), 9)] if passes else [((2, 4, 3, 28, 28), 8)])


def test_model_maps_launch_exactly_the_precompiled_fold_instances():
    # The folding entries of the precompile table are those the model's ranks at each map side fold
    # (none by today's figures): none missing, none extra.
    launched = set()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for side in MODEL_MAP_SIDES:
            for rank in MODEL_FOLD_RANKS[side]:
                x = cross_fold_inputs(1, 8, side, side, rank, dtype, seed=6)
                for out_fp32 in (False, True):
                    _, plan, _ = cross_rows_launch.cross_forward_design(*args(x), CODES, out_fp32,
                                                                       x["delta_proj_weight"])
                    if plan.fold:
                        launched.add(cross_rows_launch.plan_spec(plan, dtype).name)
    table = {name for name in KERNELS if name.startswith("rows_cross_forward.") and name.endswith("f")}
    assert launched == table


@pytest.mark.slow
@pytest.mark.parametrize("arch", [75, 80, 86, 89, 90])
def test_folding_entries_compile_without_spills(arch):
    # Every model plan of the folding instance (fp32: V = 2 at 56 / 28 / 14; fp16 / bf16: V = 4 at 56 / 28,
    # 2 at 14; V = 1 at 7), each input type: within the launch bounds' registers (the plan's: 80 at
    # V = 4, else 64; 72 for fp16 on sm_75 at V <= 2), no spills, no stack.
    for dtype in ("fp32", "fp16", "bf16"):
        for side in MODEL_MAP_SIDES:
            size = 2 if dtype != "fp32" else 4
            plan = rows_plan.cross_plan(size, size, side).folding(size)  # one row ahead, its own blocks
            compiled = nvrtc.compile_kernel(rows_cross_kernel(dtype, plan.vec, plan.load, plan.scan_steps, fold=True,
                                                              min_blocks=plan.min_blocks), arch, TOOLCHAIN)
            r = compiled.resources
            limit = 72 if (arch, dtype, plan.vec) in ((75, "fp16", 2), (75, "fp16", 1)) else plan.registers
            assert r.registers <= limit and r.spill_stores + r.spill_loads == 0 and r.stack_bytes == 0, (
                dtype, side, r)
