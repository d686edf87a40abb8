"""The v4 four-route forward (CrossRowsForward: VMamba's cross routes in one kernel) on the NVRTC path
without a GPU: its plan rule, the choice between it and v3's per-route kernels for the CUDA four-route
op, the entry compiling with NVRTC within the plan's registers, and the launch passing the plan's grid / block
and a parameter block in the four-route layout on the current stream (recording fake driver)."""
from __future__ import annotations


import pytest
import torch

from vmamba2d.ops import CROSS_ROUTES, tuning
from vmamba2d.ops.compiled import cross_rows_launch, nvrtc, rows_launch, rows_plan
from vmamba2d.ops.compiled.cuda_kernels import KERNELS, MODEL_MAP_SIDES, rows_cross_kernel

try:
    TOOLCHAIN = nvrtc.find_toolchain()
except nvrtc.NvrtcUnavailable as err:
    pytest.skip(f"no NVRTC toolchain: {err}", allow_module_level=True)

from support.nvrtc_recording import recording_launcher, stub_kernel  # noqa: E402
from support.rows_cases import assert_cross_params  # noqa: E402

CODES = [route.code for route in CROSS_ROUTES]


def cross_inputs(batch, dim, height, width, dtype=torch.float32, seed=0, channels_last=False):
    """The CUDA four-route op's inputs at N = 1 (u (batch, dim, H, W), delta (batch, 4, dim, H, W),
    A (4 dim, 1), B, C (batch, 4, 1, H, W), D, delta_bias (4 dim,))."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, dim, height, width, generator=g).to(dtype)
    if channels_last:
        u = u.contiguous(memory_format=torch.channels_last)
    delta = torch.randn(batch, 4, dim, height, width, generator=g).to(dtype)
    B, C = (torch.randn(batch, 4, 1, height, width, generator=g).to(dtype) for _ in range(2))
    A = -torch.rand(4 * dim, 1, generator=g)
    return u, delta, A, B, C, torch.randn(4 * dim, generator=g), torch.randn(4 * dim, generator=g)


def test_codes_are_the_kernels_routes():
    assert tuple(CODES) == rows_plan.CROSS_ROUTE_CODES


def test_plan_rule():
    # fp16 / bf16: four columns a lane wherever 4 divides W within 32 lanes, else two, else one; fp32:
    # two, else one. Odd W > 32, W > 128 (2-byte) and W > 64 (fp32): none.
    for elem_bytes, cases in ((2, ((56, 4, 14), (28, 4, 7), (14, 2, 7), (7, 1, 7), (64, 4, 16), (12, 4, 3),
                                   (20, 4, 5), (128, 4, 32), (62, 2, 31), (31, 1, 31), (1, 1, 1))),
                              (4, ((56, 2, 28), (28, 2, 14), (14, 2, 7), (7, 1, 7), (64, 2, 32), (12, 2, 6),
                                   (31, 1, 31), (1, 1, 1)))):
        for width, vec, seg in cases:
            plan = rows_plan.cross_plan(elem_bytes, elem_bytes, width)
            assert (plan.vec, plan.load, plan.seg_lanes, plan.maps_per_warp) == (vec, vec, seg, 32 // seg), width
            assert plan.scan_steps == rows_plan.scan_steps(seg)
            # u and delta two rows ahead: fp16 / bf16 at 4 columns with the entry compiled for 5 blocks a
            # SM (96 registers, 20 warps), at 2 for 6 (80, 24), at 1 for 8 (64, 32); fp32 at 1 column
            # (8: 64, 32); fp32 at 2 columns one row ahead at 8 (64, 32)
            deep = {(2, 4): (2, 5, 96, 20), (2, 2): (2, 6, 80, 24), (2, 1): (2, 8, 64, 32), (4, 1): (2, 8, 64, 32)}
            assert (plan.prefetch, plan.min_blocks, plan.registers, plan.resident_warps) == deep.get(
                (elem_bytes, vec), (1, 8, 64, 32)), width
            # the folding instance at the same V holds one row ahead (80 registers at 4 columns)
            fold = plan.folding(elem_bytes)
            assert (fold.fold, fold.vec, fold.prefetch, fold.min_blocks) == (True, vec, 1, 6 if vec == 4 else 8)
    for width in (33, 66, 68, 128):
        assert rows_plan.cross_plan(4, 4, width) is None, width
    for width in (33, 66, 130, 132):
        assert rows_plan.cross_plan(2, 2, width) is None, width
    assert (rows_plan.cross_max_width(2), rows_plan.cross_max_width(4)) == (128, 64)
    # vector accesses need the inputs' and y's vector alignment (y is read back by the second sweep)
    assert rows_plan.cross_plan(2, 4, 56, 8).load == 1 and rows_plan.cross_plan(2, 4, 56, 16).load == 4
    assert rows_plan.cross_plan(2, 2, 56, 4).load == 1 and rows_plan.cross_plan(2, 2, 56, 8).load == 4
    assert rows_plan.cross_plan(4, 4, 56, 4).load == 1 and rows_plan.cross_plan(4, 4, 56, 8).load == 2
    assert rows_plan.cross_plan(2, 2, 14, 4).load == 2
    with pytest.raises(ValueError, match="elem_bytes, y_bytes"):
        rows_plan.cross_plan(8, 8, 56)


def test_backend_info_names_the_lane_rule():
    from vmamba2d.ops import backend_info

    lanes = backend_info()["scan_plan"]["cuda_four_route_lanes"]
    assert lanes.startswith("columns a lane V: fp16 / bf16 4 where 4 divides W (W <= 128), else 2, 1; fp32 2, "
                            "else 1 (W <= 64): the widest V dividing W within 32 lanes; rows of u and delta held "
                            "ahead P by the in-flight estimate -- fp16 / bf16 V = 4: P = 2 (5 blocks / SM, 96 "
                            "registers), 2: P = 2 (6 blocks / SM, 80 registers), 1: P = 2 (8 blocks / SM, 64 "
                            "registers); fp32 V = 2: P = 1 (8 blocks / SM, 64 registers), 1: P = 2 (8 blocks / SM, "
                            "64 registers)")


def test_register_caps_and_resident_warps():
    # ptxas's cap under __launch_bounds__(128, blocks) and the warps an SM keeps at it (64K registers).
    assert [rows_plan.register_cap(b) for b in (8, 7, 6, 5, 4)] == [64, 72, 80, 96, 128]
    assert [rows_plan.resident_warps(r) for r in (48, 63, 64, 78, 80, 92, 96)] == [40, 32, 32, 24, 24, 20, 20]
    # the four-route entry's blocks per SM by (element size, V, P); no figures for deeper rings
    assert [rows_plan.cross_min_blocks(e, v, p) for e, v, p in ((2, 4, 1), (4, 4, 1), (2, 2, 1), (2, 4, 2),
                                                                (4, 2, 2), (2, 2, 2), (2, 1, 2), (4, 1, 2))] == [
        6, 5, 8, 5, 7, 6, 8, 8]
    with pytest.raises(ValueError, match="P = 3"):
        rows_plan.cross_min_blocks(2, 4, 3)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("width", [56, 28, 14, 7])
def test_plan_follows_its_estimate_at_the_model_widths(dtype, width):
    # cross_plan's V and P are the ones its written estimate takes (rows_plan.cross_estimate from the
    # sm_90 static figures): four columns where they beat two by CROSS_WIDE_MARGIN, two rows ahead
    # where they beat one by it at that V.
    size = 4 if dtype == "fp32" else 2
    plan = rows_plan.cross_plan(size, size, width)
    if width % 4 == 0:
        assert plan.vec == (4 if rows_plan.cross_wide_pays(dtype, width) else 2)
    assert plan.prefetch == (2 if rows_plan.cross_deep_pays(dtype, width, plan.vec) else 1)
    assert plan.min_blocks == rows_plan.cross_min_blocks(size, plan.vec, plan.prefetch)
    issue, in_flight = rows_plan.cross_estimate(dtype, width, plan.vec, plan.prefetch)
    assert 0 < issue <= 1 and 0 < in_flight <= 1
    # each figure's registers are within the cap the plan compiles that (V, P) for
    for vec, prefetch in rows_plan.cross_instances(size, width):
        blocks = rows_plan.cross_min_blocks(size, vec, prefetch)
        assert rows_plan.CROSS_VEC_FIGURES[(dtype, width, vec, prefetch)][1] <= rows_plan.register_cap(blocks)


def test_estimate_by_hand():
    # bf16 at 56 on the H200: 18 B / cell·ch at 8.0 instructions a byte against 215.7 / 164.4 SASS;
    # 32 / 24 warps x 3 loads x 56 / 112 cells x 2 B against ~23.9 KB.
    per_byte = 132 * 4 * 32 * 1.98e9 / 4.2e12
    little = 4.2e12 * 0.75e-6 / 132
    assert rows_plan.cross_estimate("bf16", 56, 2) == pytest.approx((18 * per_byte / 215.7, 32 * 3 * 56 * 2 / little))
    assert rows_plan.cross_estimate("bf16", 56, 4) == pytest.approx((18 * per_byte / 164.4, 24 * 3 * 112 * 2 / little))
    assert rows_plan.cross_estimate("fp32", 56, 4) == (1.0, 1.0)
    # two rows ahead: 172.0 SASS at 96 registers (20 warps) x 2 rows; in flight past 100% is capped
    assert rows_plan.cross_estimate("bf16", 56, 4, 2) == pytest.approx((18 * per_byte / 172.0, 1.0))
    assert 20 * 2 * 3 * 112 * 2 / little > 1
    assert rows_plan.cross_deep_pays("bf16", 56, 4)  # 83% against 68%: x 1.23 >= 1.2
    # fp32 at V = 2: 100% (issue 137%, 28 warps x 2 rows x 3 x 56 x 4 B in flight) against 90%: x 1.11
    assert min(rows_plan.cross_estimate("fp32", 56, 2, 2)) == 1.0
    assert not rows_plan.cross_deep_pays("fp32", 56, 2)
    # 14 columns, bf16 V = 2 (4 maps a warp): 197.4 SASS, 32 warps one row ahead (45% in flight) against
    # 213.3 at 79 registers, 24 warps two rows ahead (67% issue): x 1.49
    assert rows_plan.cross_estimate("bf16", 14, 2) == pytest.approx((18 * per_byte / 197.4, 32 * 3 * 4 * 14 * 2 / little))
    assert rows_plan.cross_estimate("bf16", 14, 2, 2) == pytest.approx((18 * per_byte / 213.3,
                                                                        24 * 2 * 3 * 4 * 14 * 2 / little))
    assert rows_plan.cross_deep_pays("bf16", 14, 2) and rows_plan.cross_deep_rule(2, 2)
    # 7 columns, V = 1: two rows ahead fit 64 registers (32 warps): the bytes in flight double
    assert rows_plan.cross_estimate("bf16", 7, 1, 2) == pytest.approx((18 * per_byte / 312.9, 32 * 2 * 3 * 4 * 7 * 2 / little))
    assert rows_plan.cross_deep_pays("fp32", 7, 1) and rows_plan.cross_deep_rule(4, 1)
    # fp32 at 14: 90% (in flight) against 100%: x 1.11, as at 56 / 28
    assert not rows_plan.cross_deep_pays("fp32", 14, 2) and not rows_plan.cross_deep_rule(4, 2)
    with pytest.raises(ValueError, match="no figures"):
        rows_plan.cross_estimate("bf16", 14, 4)
    with pytest.raises(ValueError, match="no figures"):
        rows_plan.cross_estimate("bf16", 56, 4, 3)


@pytest.mark.parametrize("side", [56, 28, 14, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_model_maps_take_the_four_route_kernel(side, dtype):
    for out_fp32 in (False, True):
        for channels_last in (False, True):
            x = cross_inputs(2, 8, side, side, dtype, channels_last=channels_last)
            design, plan, why = cross_rows_launch.cross_forward_design(*x, CODES, out_fp32)
            assert design == "rs" and plan == rows_plan.cross_plan(x[0].element_size(), 4 if out_fp32 else
                                                                   x[0].element_size(), side)
            limit = 64 if dtype == torch.float32 else 128  # 32 lanes of rows_plan.cross_max_vec columns
            assert why == (f"PL (L = 49 <= 64): not built for cuda; RS: N = 1, width 7 <= {limit}" if side == 7
                           else f"RS: N = 1, width {side} <= {limit}")


def test_other_calls_stay_on_v3(monkeypatch):
    x = cross_inputs(2, 4, 14, 14)
    other = [0, 4, 3, 6]
    assert cross_rows_launch.cross_forward_design(*x, other, False) == (
        "v3", None, "V3: routes [0, 4, 3, 6]: the cuda four-route RS kernel runs the cross routes [0, 4, 3, 7] only")
    assert cross_rows_launch.cross_forward_design(*x, [8, 12, 11, 15], False)[0] == "v3"  # VMamba's flat routes
    u, delta, A, B, C, D, bias = x
    nstate = (u, delta, torch.cat([A] * 4, 1), torch.cat([B] * 4, 2), torch.cat([C] * 4, 2), D, bias)
    assert cross_rows_launch.cross_forward_design(*nstate, CODES, False)[2] == "V3: N = 4: PL and RS run d_state 1 only"
    design, _, why = cross_rows_launch.cross_forward_design(u, delta, A, B, C, D.double(), bias, CODES, False)
    assert design == "v3" and "preconditions" in why
    design, _, why = cross_rows_launch.cross_forward_design(u, delta[:, :3], A, B, C, D, bias, CODES, False)
    assert design == "v3" and "preconditions" in why  # v3's host driver names what is wrong
    x = cross_inputs(1, 4, 3, 35)
    assert cross_rows_launch.cross_forward_design(*x, CODES, False) == (
        "v3", None, "RS: N = 1, width 35 <= 64, but no lane width of 2 or 1 columns divides W = 35 within 32 lanes")
    assert cross_rows_launch.cross_forward_design(*cross_inputs(1, 4, 2, 66), CODES, False)[0] == "v3"
    # 2-byte inputs: 4 columns a lane reach W = 128; 66 has neither 4 nor 2 within 32 lanes
    assert cross_rows_launch.cross_forward_design(*cross_inputs(1, 4, 2, 66, torch.bfloat16), CODES, False) == (
        "v3", None, "RS: N = 1, width 66 <= 128, but no lane width of 4, 2 or 1 columns divides W = 66 within 32 lanes")
    design, plan, _ = cross_rows_launch.cross_forward_design(*cross_inputs(1, 4, 2, 68, torch.bfloat16), CODES, False)
    assert design == "rs" and (plan.vec, plan.seg_lanes, plan.prefetch, plan.min_blocks) == (4, 17, 2, 5)
    wide = cross_rows_launch.cross_forward_design(*cross_inputs(1, 4, 2, 132, torch.float16), CODES, False)
    assert wide[0] == "v3" and "width 132 > 128" in wide[2]
    monkeypatch.setenv(rows_launch.PLAN_ENV, "v3")
    assert cross_rows_launch.cross_forward_design(*cross_inputs(2, 4, 14, 14), CODES, False)[:2] == ("v3", None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_model_entry_compiles_within_the_plans_registers_without_spills(dtype):
    # sm_90, the 56 x 56 plan (bf16: 4 columns two rows ahead, compiled for 5 blocks -> 96 registers;
    # fp32: 2 columns one row ahead, 64); the static report covers every model plan, dtype and arch with nvcc.
    plan = rows_plan.cross_plan(dtype.itemsize, dtype.itemsize, 56)
    spec = cross_rows_launch.plan_spec(plan, dtype)
    assert dict(spec.defines).get("VMAMBA2D_RS_MIN_BLOCKS") == ("5" if dtype == torch.bfloat16 else None)
    assert dict(spec.defines).get("VMAMBA2D_RS_PREFETCH") == ("2" if dtype == torch.bfloat16 else None)
    compiled = nvrtc.compile_kernel(spec, 90, TOOLCHAIN)
    r = compiled.resources
    assert compiled.lowered_name == "vmamba2d_rows_cross_forward"
    assert r.registers <= plan.registers == (96 if dtype == torch.bfloat16 else 64)
    assert r.spill_stores + r.spill_loads == 0 and r.stack_bytes == 0
    if dtype == torch.bfloat16:
        assert r.registers > 80  # the cap is the plan's, not the one-row-ahead kernel's (which would spill)


def test_spec_compiles_the_cross_entry():
    spec = rows_cross_kernel("fp16", 2, 1, 4)
    assert (spec.source, spec.symbol, spec.name_expression) == (
        "entries/scan2d_rows_entry.cu", "vmamba2d_rows_cross_forward", False)
    assert dict(spec.defines) == {"VMAMBA2D_RS_CROSS": "1", "VMAMBA2D_RS_DTYPE": "1", "VMAMBA2D_RS_VEC": "2",
                                  "VMAMBA2D_RS_LOAD": "1", "VMAMBA2D_RS_STEPS": "4"}
    # the bf16 56 x 56 plan: 4 columns, two rows ahead, compiled for 5 blocks per SM (both named, so the
    # cache keeps it apart from the pinned one-row-ahead instance at 6 blocks)
    spec = cross_rows_launch.plan_spec(rows_plan.cross_plan(2, 2, 56), torch.bfloat16)
    assert spec.name == "rows_cross_forward.bf16.v4l4p2s4b5"
    assert dict(spec.defines) == {"VMAMBA2D_RS_CROSS": "1", "VMAMBA2D_RS_DTYPE": "2", "VMAMBA2D_RS_VEC": "4",
                                  "VMAMBA2D_RS_LOAD": "4", "VMAMBA2D_RS_STEPS": "4", "VMAMBA2D_RS_PREFETCH": "2",
                                  "VMAMBA2D_RS_MIN_BLOCKS": "5"}
    one = rows_cross_kernel("bf16", 4, 4, 4, min_blocks=6)
    assert one.name == "rows_cross_forward.bf16.v4l4s4b6" and "VMAMBA2D_RS_PREFETCH" not in dict(one.defines)


@pytest.fixture()
def launcher(tmp_path):
    launcher, driver = recording_launcher(tmp_path, TOOLCHAIN)
    return launcher, driver, tmp_path


@pytest.mark.parametrize("dtype,out_fp32,channels_last,side", [
    (torch.bfloat16, False, False, 14), (torch.float32, False, True, 14), (torch.float16, True, False, 14),
    (torch.bfloat16, False, True, 14), (torch.bfloat16, False, False, 56), (torch.float16, True, True, 28)])
def test_launch_passes_plan_grid_and_parameter_block(launcher, dtype, out_fp32, channels_last, side):
    # 56 / 28 in 2-byte types: the 4-column plan two rows ahead, its entry compiled for 5 blocks per SM
    launcher, driver, folder = launcher
    batch, dim = 3, 10
    u, delta, A, B, C, D, bias = cross_inputs(batch, dim, side, side, dtype, channels_last=channels_last)
    design, plan, _ = cross_rows_launch.cross_forward_design(u, delta, A, B, C, D, bias, CODES, out_fp32)
    spec = cross_rows_launch.plan_spec(plan, dtype)
    assert plan.vec == (4 if side in (56, 28) else 2)
    assert spec.name.endswith("p2s4b5" if side == 56 else "p2s3b5") == (plan.vec == 4)
    stub_kernel(folder, spec, TOOLCHAIN)
    seen = driver.read_params(rows_launch.RowsParams)
    y = cross_rows_launch.launch_forward(launcher, u, delta, A, B, C, D, bias, True, CODES, out_fp32)
    assert y.shape == u.shape and y.dtype == (torch.float32 if out_fp32 else dtype)
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    (launch,) = driver.of("launch")
    assert launch[1][2] == f"sym_{spec.file_stem}"
    assert launch[2:6] == ((plan.blocks(batch, dim), 1, 1), 128, 0, 1000)
    assert plan.blocks(batch, dim) * 4 * plan.maps_per_warp >= batch * dim
    ((p,),) = seen
    assert_cross_params(p, plan, (delta, B, C, A, D, bias), batch, dim, side, 4 * dim, y)
    if not channels_last:  # else the kernel reads a contiguous copy of u and writes y before its layout copy
        assert (p.u, p.y) == (u.data_ptr(), y.data_ptr())


def test_v3_calls_launch_nothing(launcher):
    launcher, driver, _ = launcher
    x = cross_inputs(2, 4, 14, 14)
    assert cross_rows_launch.launch_forward(launcher, *x, True, [0, 4, 3, 6], False) is None
    assert driver.of("launch") == []


def test_tuner_times_each_block_size_and_the_grid_covers_every_map(launcher):
    launcher, driver, folder = launcher
    batch, dim, side = 3, 10, 7
    x = cross_inputs(batch, dim, side, side)
    _, plan, _ = cross_rows_launch.cross_forward_design(*x, CODES, False)
    stub_kernel(folder, cross_rows_launch.plan_spec(plan, torch.float32), TOOLCHAIN)

    def timer(fn):
        fn()
        return {32: 0.3, 64: 0.2, 128: 0.4}[driver.of("launch")[-1][3]]

    tuner = tuning.Tuner(timer=timer, cache_root=folder / "t", ranks=lambda: 1, skip_reason=lambda: None)
    cross_rows_launch.launch_cross_forward(launcher, *x, True, False, plan, tuner=tuner)
    launches = driver.of("launch")
    assert len(launches) == 3 * 4 + 1 and launches[-1][3] == 64  # 2 warps a block: the fake clock's fastest
    items = -(-batch * dim // plan.maps_per_warp)
    for launch in launches:
        warps = launch[3] // 32
        assert launch[2][0] * warps >= items > (launch[2][0] - 1) * warps


def test_model_maps_launch_exactly_the_precompiled_instances():
    # The four-route entries of the precompile table are the instances the model's maps launch (every
    # input type, contiguous or channels-last u, y fp32 or the input type): none missing, none extra.
    launched = set()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for side in MODEL_MAP_SIDES:
            for channels_last in (False, True):
                u, delta, A, B, C, D, bias = cross_inputs(2, 8, side, side, dtype, channels_last=channels_last)
                for out_fp32 in (False, True):
                    design, plan, why = cross_rows_launch.cross_forward_design(u, delta, A, B, C, D, bias, CODES,
                                                                               out_fp32)
                    assert design == "rs", why
                    spec = cross_rows_launch.plan_spec(plan, dtype)
                    assert KERNELS.get(spec.name) == spec, spec.name
                    launched.add(spec.name)
    assert launched == {name for name in KERNELS if name.startswith("rows_cross_forward.")}
