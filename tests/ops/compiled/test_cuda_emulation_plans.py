"""The CUDA kernel's work split on every GPU class it is built for, emulated on the CPU.

The launch plan depends on the device: SM count (tile-parallel or sequential walk of a map's
tiles) and shared memory per block / per SM (channels and warps per block in the forward and
backward). Each plan runs different kernel code paths, so every (device, plan) pair runs the
emulated kernel with the race detector on and a shuffled execution order, for the inference
forward (no saved carries), the training forward (saved carries) and the backward, against the
independent fp64 reference of tests/ops/compiled/test_scan_cuda.py; and so do the four-route op's route kernels
(one launch per route, each planned for its route's grid), against the fp64 per-route reference of
tests/ops/compiled/test_cuda_emulation_routes.py.
"""
from __future__ import annotations

import pytest
import torch

from support.v3_cases import (EMULATION, ORDER, assert_close, check_all, emulated_bwd,
                            emulated_fwd, make_inputs, reference)

KIB = 1024
# Opt-in shared memory per block and shared memory per SM, as the devices report them
# (cudaDevAttrMaxSharedMemoryPerBlockOptin / PerMultiprocessor), their SM counts, and their compute
# capability (x 10: T4 and RTX 3090 run the forward's register-carry form the GPU build compiles for
# sm_75 and sm_86 .. sm_89 only; 1 KiB of shared memory reserved per block from sm_80 on).
DEVICES = {
    "sm75-T4": dict(sm_count=40, smem_per_block=64 * KIB, smem_per_sm=64 * KIB, arch=75),
    "sm86-RTX3090": dict(sm_count=82, smem_per_block=99 * KIB, smem_per_sm=100 * KIB, arch=86),
    "sm80-A100": dict(sm_count=108, smem_per_block=163 * KIB, smem_per_sm=164 * KIB, arch=80),
    "sm90-H100": dict(sm_count=132, smem_per_block=227 * KIB, smem_per_sm=228 * KIB, arch=90),
}
# sequential: one SM, so each block walks its map's tiles in order (carries in shared memory; the
# forward of the N = 64 map on an H100 goes tile-parallel even there: its 1-warp blocks leave the
# SM's slots idle); tile-parallel: the device's SM count, more resident slots than these few maps
# fill, so the tiles of a map run in parallel with carry scans between the passes.
PLANS = ("sequential", "tile-parallel")
# (batch, dim, groups, N, height, width, dtype): several tiles with partial edges each, so both
# plans differ; N = 1 with 4 channels per group (several channels per block) in each dtype (the
# one-state kernel variant is compiled per dtype, with fp32 output / gradient options for the half
# types; one fp16 map of a single tile), N = 2 and 16 (warps
# split the states; the smaller devices take fewer channels / warps per block), N = 64.
SHAPES = [
    (1, 8, 2, 1, 40, 45, torch.float32),
    (2, 8, 2, 1, 37, 41, torch.bfloat16),
    (2, 8, 1, 1, 33, 35, torch.float16),
    (4, 8, 1, 1, 20, 30, torch.float16),
    (3, 4, 1, 2, 33, 40, torch.bfloat16),
    (1, 2, 1, 16, 35, 33, torch.float16),
    (1, 1, 1, 64, 33, 34, torch.float32),
]


def _options(device: str, plan: str, order: int) -> dict:
    limits = dict(DEVICES[device])
    if plan == "sequential":
        limits["sm_count"] = 1
    return dict(limits, order=order, race_check=True)


def _shape_id(shape) -> str:
    return "x".join(map(str, shape[:-1])) + "-" + str(shape[-1]).replace("torch.", "")


@pytest.mark.parametrize("dim, use_d, use_bias", [(8, False, False), (8, False, True), (6, True, True)])
def test_register_carry_form_without_skip_or_bias(dim, use_d, use_bias):
    # The one-state forward compiled for sm_86 .. sm_89 (horizontal carries in registers, no carry
    # rows) on a map of 2 x 2 tiles, with D None (no dD) or not; dim 6 in 2 groups: blocks of 3
    # channels leave a channel slot empty.
    inputs = make_inputs(1, dim, 2, 1, 40, 45, use_d=use_d, use_bias=use_bias, softplus=False, seed=41)
    options = _options("sm86-RTX3090", "sequential", order=3)
    plan = EMULATION._launch_plan(1, dim, 2, 1, 40, 45, 1, options["smem_per_sm"], options["smem_per_block"],
                                    arch=86)
    assert plan["fwd_variant"] == "kOneStateSequential"
    assert plan["fwd_smem_bytes"] == plan["fwd_channels"] * 2 * 4096  # x and Abar tiles only
    check_all(emulated_fwd, emulated_bwd, inputs, 40, 45, rtol=5e-5, softplus=False, **options)


@pytest.mark.parametrize("softplus", [True, False], ids=["softplus", "no-softplus"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(5, 6, 2, 1, 5, 7), (2, 6, 2, 1, 40, 48)], ids=["packed-5x7", "aligned-40x48"])
@pytest.mark.parametrize("device", ["sm75-T4", "sm86-RTX3090", "sm90-H100"])
def test_one_state_forms_on_three_channel_blocks(device, shape, dtype, softplus):
    # The one-state forward compiled for sm_75 and sm_86 .. sm_89 (horizontal carries in registers)
    # and for the other archs, without D, in blocks of 3 channels (an empty channel slot): 5 x 7 maps
    # packed 6 x 4 into a tile (scans restart inside tile rows and columns); 40 x 48 maps of 2 x 2
    # tiles whose rows are whole quads (the vector path); a 2-byte type's y in fp32 with softplus, in
    # its own type without.
    batch, dim, groups, nstate, height, width = shape
    inputs = make_inputs(*shape, dtype=dtype, use_d=False, softplus=softplus, seed=43)
    options = _options(device, "sequential", order=2)
    plan = EMULATION._launch_plan(*shape, 1, options["smem_per_sm"], options["smem_per_block"],
                                    arch=options["arch"])
    assert (plan["fwd_variant"], plan["fwd_channels"]) == ("kOneStateSequential", dim // groups)
    half = dtype != torch.float32
    check_all(emulated_fwd, emulated_bwd, inputs, height, width, rtol=3e-2 if half else 5e-5, softplus=softplus,
              out_fp32=half and softplus, **options)


@pytest.mark.parametrize("softplus", [True, False], ids=["softplus", "no-softplus"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dim, height, width", [(4, 8, 12), (1, 8, 12), (3, 37, 41)],
                         ids=["4ch-8x12", "1ch-8x12", "3ch-37x41"])
@pytest.mark.parametrize("device", ["sm86-RTX3090", "sm75-T4"])
def test_register_carry_forms_of_the_route_op(device, dim, height, width, dtype, softplus):
    # The route op's one-state forward compiled for sm_75 and sm_86 .. sm_89 (register carries):
    # 8 x 12 maps (the linear routes on the vector path) with 4 channels per block or 1, 37 x 41
    # maps of several tiles with 3 (an empty channel slot); with softplus, D and delta_bias, or none
    # of them; against the fp64 per-route reference.
    from support.route_cases import CROSS_2D, NAMES, make_inputs as route_inputs
    from vmamba2d.ops.interface import cross_scan_per_route
    from vmamba2d.ops.routes import Route

    options = _options(device, "sequential", order=5)
    del options["order"]
    for code in CROSS_2D:
        launch = EMULATION._launch_plan(2, dim, 1, 1, height, width, 1, options["smem_per_sm"],
                                          options["smem_per_block"], route=code, arch=options["arch"])
        # No carry rows: 64 B of per-block constants and the x / Abar tiles (T4: 2-channel blocks
        # for dim 4, as 4 channels and the constants exceed 32 KiB).
        assert launch["fwd_variant"] == "kOneStateRoute"
        assert launch["fwd_smem_bytes"] == 64 + launch["fwd_channels"] * 2 * 4096
    inputs = route_inputs(2, dim, CROSS_2D, 1, height, width, dtype=dtype, seed=47)
    if not softplus:
        inputs["delta"] = (inputs["delta"].float().abs() * 0.2 + 0.02).to(dtype)
    args = [None if n in ("D", "delta_bias") and not softplus else inputs[n] for n in NAMES]
    dy = torch.randn(inputs["u"].shape, generator=torch.Generator().manual_seed(6)).to(dtype)
    y = EMULATION._emulate_cross_forward(*args, softplus, CROSS_2D, False, order=3, **options)
    grads = EMULATION._emulate_cross_backward(*args, softplus, CROSS_2D, dy, order=4, **options)
    leaves = [None if t is None else t.double().requires_grad_() for t in args]
    y_ref = cross_scan_per_route(*leaves, softplus, tuple(Route.from_code(c) for c in CROSS_2D), "torch",
                                 torch.float64)
    y_ref.backward(dy.double())
    rtol = 5e-5 if dtype == torch.float32 else 3e-2
    assert_close("y", y, y_ref.detach(), rtol)
    for name, got, leaf in zip(NAMES, grads, leaves):
        assert (got is None) == (leaf is None), name
        if leaf is not None:
            assert_close("d" + name, got, leaf.grad, rtol)


@pytest.mark.parametrize("device", ["sm75-T4", "sm86-RTX3090"])
def test_register_carries_are_bitwise_equal_across_thread_orders(device):
    # The register carry is per thread (thread slot w * 32 + r in the emulation), outside the race
    # detector's shared memory: a carry read from another lane's or warp's slot would change y
    # with the order the emulation runs the threads in. Maps of 2 x 2 tiles, single route and route op.
    from support.route_cases import CROSS_2D, NAMES, make_inputs as route_inputs

    options = _options(device, "sequential", order=0)
    del options["order"]
    inputs = make_inputs(2, 8, 2, 1, 40, 45, seed=51)
    args = [inputs[k] for k in ORDER]
    singles = [emulated_fwd(*args, True, 40, 45, False, False, order=order, **options)[0] for order in (1, 2, 17)]
    routes = route_inputs(2, 4, CROSS_2D, 1, 37, 41, seed=52)
    crosses = [EMULATION._emulate_cross_forward(*(routes[n] for n in NAMES), True, CROSS_2D, False, order=order,
                                                  **options) for order in (1, 2, 17)]
    for runs in (singles, crosses):
        assert all(torch.equal(runs[0], other) for other in runs[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("device", ["sm75-T4", "sm86-RTX3090"])
def test_tile_parallel_route_forward_in_the_layout_without_carry_rows(device, dtype):
    # N = 1, one warp per channel on a register-carry arch: the launch's layout has no carry rows
    # (the one-state form's), and the tile-parallel passes of the general route forward, which take
    # their carries from global memory, run in it; 37 x 41 maps (2 x 2 tiles, 3 x 2 on the
    # columns-first routes) against the fp64 per-route reference.
    from support.route_cases import CROSS_2D, check as check_routes, make_inputs as route_inputs

    options = _options(device, "tile-parallel", order=0)
    del options["order"]
    for code in CROSS_2D:
        launch = EMULATION._launch_plan(1, 2, 1, 1, 37, 41, options["sm_count"], options["smem_per_sm"],
                                          options["smem_per_block"], route=code, arch=options["arch"])
        assert (launch["fwd_variant"], launch["fwd_tile_parallel"]) == ("kRoute", True)
        assert launch["fwd_smem_bytes"] == 64 + launch["fwd_channels"] * 2 * 4096
    half = dtype != torch.float32
    check_routes(route_inputs(1, 2, CROSS_2D, 1, 37, 41, dtype=dtype, seed=49), CROSS_2D,
                 rtol=3e-2 if half else 5e-5, seed=3, **options)


@pytest.mark.parametrize("dtype, dy_fp32", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True),
                                           (torch.float16, False), (torch.float16, True)])
def test_tile_parallel_one_state_backward_on_the_vector_path(dtype, dy_fp32):
    # N = 1 on 40 x 48 maps (2 x 2 tiles whose rows are whole quads) in the tile-parallel plan: the
    # general backward records each quad's anchor in its first phase and its last phase takes the
    # vector accesses of the recorded anchors, with dy in the inputs' type or in fp32.
    inputs = make_inputs(1, 8, 2, 1, 40, 48, dtype=dtype, seed=45)
    options = _options("sm90-H100", "tile-parallel", order=4)
    plan = EMULATION._launch_plan(1, 8, 2, 1, 40, 48, options["sm_count"], options["smem_per_sm"],
                                    options["smem_per_block"], arch=options["arch"])
    assert plan["bwd_tile_parallel"] and plan["bwd_variant"] == "kGeneral"
    half = dtype != torch.float32
    check_all(emulated_fwd, emulated_bwd, inputs, 40, 48, rtol=3e-2 if half else 5e-5,
              dy_fp32=dy_fp32, **options)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("device", list(DEVICES))
def test_every_device_plan_matches_reference(device, plan, shape):
    batch, dim, groups, nstate, height, width, dtype = shape
    seed = list(DEVICES).index(device) * 10 + SHAPES.index(shape)
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, seed=seed)
    half = dtype != torch.float32
    rtol = 3e-2 if half else 5e-5
    args = [inputs[k] for k in ORDER]

    # Half types: fp32 and input-dtype outputs / output gradients alternate over the devices, so
    # each kernel variant of each dtype runs both.
    fp32_out = half and list(DEVICES).index(device) % 2 == 0
    # Inference: no carries saved (the path a torch.no_grad() forward takes).
    y_infer, carry_h, carry_v = emulated_fwd(*args, True, height, width, fp32_out, False,
                                             **_options(device, plan, order=2 + seed))
    assert carry_h.numel() == 0 and carry_v.numel() == 0
    dy = torch.zeros(y_infer.shape, dtype=y_infer.dtype)
    y_ref, _ = reference(inputs, dy, height, width)
    assert_close("y (inference)", y_infer, y_ref, rtol)

    # Training: forward saving the tile carries, backward from them, in another shuffled order.
    y_train, _ = check_all(emulated_fwd, emulated_bwd, inputs, height, width, rtol=rtol,
                           dy_fp32=half and not fp32_out, out_fp32=half,
                           **_options(device, plan, order=100 + seed))
    # Saving carries does not change the arithmetic: both forwards agree to the bit (after the
    # same rounding to the output dtype).
    assert torch.equal(y_infer, y_train.to(y_infer.dtype))


@pytest.mark.parametrize("limits, message", [
    (dict(smem_per_block=32 * KIB), "smem_per_block must be >= 48 KiB"),
    (dict(smem_per_block=100 * KIB, smem_per_sm=64 * KIB), r"smem_per_sm \(65536\) must be >= smem_per_block"),
    (dict(sm_count=0), "sm_count must be >= 1"),
])
def test_emulated_device_limits_are_validated(limits, message):
    inputs = make_inputs(1, 1, 1, 1, 4, 4)
    with pytest.raises(ValueError, match=message):
        EMULATION._emulate_forward(*(inputs[k] for k in ORDER), True, 4, 4, False, False, **limits)


def test_kernel_rejects_unsupported_dtypes_by_name():
    inputs = {k: (v.double() if v is not None else None)
              for k, v in make_inputs(1, 1, 1, 1, 4, 4).items()}
    with pytest.raises(TypeError, match="float32, float16 or bfloat16, got Double"):
        EMULATION._emulate_forward(*(inputs[k] for k in ORDER), True, 4, 4, False, False)


PLAN_SHAPES = [  # (batch, dim, groups, N, height, width)
    (128, 384, 4, 1, 56, 56), (128, 3072, 4, 1, 7, 7), (2, 6, 1, 1, 40, 40), (8192, 1, 1, 16, 14, 14),
    (1, 1, 1, 16, 200, 200), (1, 256, 1, 16, 200, 200), (3, 10, 5, 3, 33, 65), (8, 4, 1, 64, 56, 56),
    (37, 2, 1, 4, 1, 100), (3, 2, 2, 7, 300, 1),
]


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_launch_plans_respect_the_device_and_the_group_layout(device):
    limits = DEVICES[device]
    for batch, dim, groups, nstate, height, width in PLAN_SHAPES:
        plan = EMULATION._launch_plan(batch, dim, groups, nstate, height, width, limits["sm_count"],
                                        limits["smem_per_sm"], limits["smem_per_block"], arch=limits["arch"])
        for pass_ in ("fwd", "bwd"):
            channels, wpc = plan[f"{pass_}_channels"], plan[f"{pass_}_warps_per_channel"]
            assert (dim // groups) % channels == 0, (device, pass_, plan)  # one group per block
            assert 1 <= wpc <= nstate and channels * wpc <= 4
            assert plan[f"{pass_}_threads"] == 32 * channels * wpc
            assert plan[f"{pass_}_smem_bytes"] <= limits["smem_per_block"]
            assert plan[f"{pass_}_resident_warps"] >= channels * wpc
        assert (dim // groups // plan["bwd_channels"]) % plan["bwd_slices"] == 0


def test_one_state_blocks_are_128_threads_on_h100_in_both_passes():
    # vmamba2d_tiny's scan calls (N = 1, 96 channels per group) on an H100 / H200: 4 channels of a
    # group per block, one warp each; the backward's 4-channel blocks (one-state variant: dt, u and
    # dy not kept on chip, 128 registers) fit four times per SM (three times before, twice in v3's
    # first version).
    limits = DEVICES["sm90-H100"]
    for side, dim in ((56, 384), (28, 768), (14, 1536), (7, 3072)):
        plan = EMULATION._launch_plan(128, dim, 4, 1, side, side, limits["sm_count"],
                                        limits["smem_per_sm"], limits["smem_per_block"], arch=90)
        assert plan["fwd_threads"] == plan["bwd_threads"] == 128
        assert plan["fwd_channels"] == plan["bwd_channels"] == 4
        assert plan["bwd_resident_warps"] == 16
        assert plan["bwd_variant"] == "kOneStateSequential" and plan["bwd_registers"] == 128


@pytest.mark.parametrize("device, arch, smem, warps", [
    ("sm90-H100", 90, 33280, 24), ("sm80-A100", 80, 33280, 16), ("sm75-T4", 75, 32768, 8),
    ("sm86-RTX3090", 86, 32768, 12),
    ("sm86-RTX3090", 80, 33280, 8),  # the sm_80 code on that GPU (a build without sm_86)
])
def test_model_forward_blocks_per_device(device, arch, smem, warps):
    # vmamba2d_tiny's forward (N = 1): a block of 4 channels takes 4 KiB x / Abar tiles per channel
    # plus 128 B of carry rows; the code built for sm_75 and sm_86 .. sm_89 keeps the carries in
    # registers instead, so three blocks fit an RTX 3090 SM's 100 KiB (two with the rows) and two a
    # T4's 64 KiB (one with the rows: it took 3-channel blocks, 6 warps). The planner sizes the
    # blocks for the code that runs there (arch), not for the GPU's own.
    limits = DEVICES[device]
    plan = EMULATION._launch_plan(128, 384, 4, 1, 56, 56, limits["sm_count"], limits["smem_per_sm"],
                                    limits["smem_per_block"], arch=arch)
    assert plan["fwd_variant"] == "kOneStateSequential"
    assert (plan["fwd_smem_bytes"], plan["fwd_resident_warps"]) == (smem, warps)


@pytest.mark.parametrize("args, message", [
    ((2, 6, 4, 1, 8, 8), "groups dividing dim"),
    ((2, 4, 1, 65, 8, 8), "N must be in 1..64"),
    ((2, 4, 1, 1, 0, 8), "height and width"),
])
def test_launch_plan_rejects_bad_shapes(args, message):
    with pytest.raises(ValueError, match=message):
        EMULATION._launch_plan(*args, 8, 164 * KIB, 163 * KIB)


def test_launch_plan_rejects_an_arch_that_is_no_compute_capability():
    with pytest.raises(ValueError, match="arch must be a compute capability x 10"):
        EMULATION._launch_plan(2, 4, 1, 1, 8, 8, 8, 164 * KIB, 163 * KIB, arch=8)


MODEL_SHAPES = [(128, dim, 4, 1, side, side) for side, dim in ((56, 384), (28, 768), (14, 1536), (7, 3072))]


def _lost_slots(blocks: int, slots: int) -> float:
    waves = -(-blocks // slots)
    return 1 - blocks / (waves * slots)


@pytest.mark.parametrize("device", ["sm80-A100", "sm90-H100"])
def test_model_shape_grids_fill_their_waves_of_resident_slots(device):
    # vmamba2d_tiny's scan calls: at most 10% of the resident block slots of the last wave stay
    # empty in either pass (the backward picks its channel slices for it; v2 put 384 blocks on
    # an H100's 264 backward slots at 14x14, losing 27%).
    limits = DEVICES[device]
    for shape in MODEL_SHAPES:
        plan = EMULATION._launch_plan(*shape, limits["sm_count"], limits["smem_per_sm"], limits["smem_per_block"],
                                        arch=limits["arch"])
        for pass_ in ("fwd", "bwd"):
            slots = limits["sm_count"] * plan[f"{pass_}_resident_blocks"]
            assert plan[f"{pass_}_resident_warps"] == plan[f"{pass_}_resident_blocks"] * plan[f"{pass_}_threads"] // 32
            assert plan[f"{pass_}_waves"] == -(-plan[f"{pass_}_blocks"] // slots)
            assert plan[f"{pass_}_lost_slots"] == pytest.approx(_lost_slots(plan[f"{pass_}_blocks"], slots))
            assert plan[f"{pass_}_lost_slots"] <= 0.10, (device, shape, pass_, plan)


def test_main_grids_count_their_blocks():
    limits = DEVICES["sm90-H100"]
    plan = EMULATION._launch_plan(128, 1536, 4, 1, 14, 14, limits["sm_count"], limits["smem_per_sm"],
                                    limits["smem_per_block"], arch=90)
    # 14x14 maps: 2 x 2 per tile, so 32 batch blocks; 4 channels per block.
    assert plan["fwd_blocks"] == 32 * 1536 // 4
    assert plan["bwd_blocks"] == 32 * 4 * plan["bwd_slices"]
    assert plan["bwd_slices"] == 4  # 512 blocks on 528 slots: 3% lost (3 slices: 384 blocks, 27%)


def test_tile_parallel_switch_weighs_waves_of_resident_slots():
    # 200 maps of 64 x 64 (2 x 2 tiles) at N = 1, one channel: 200 sequential blocks. An H100 has
    # more SMs than 200 / 2 but 24 one-warp blocks fit per SM: 3168 slots hold all 800 tile blocks
    # in one wave, so three tile-parallel passes beat four sequential tile steps.
    limits = DEVICES["sm90-H100"]
    plan = EMULATION._launch_plan(200, 1, 1, 1, 64, 64, limits["sm_count"], limits["smem_per_sm"],
                                    limits["smem_per_block"], arch=90)
    assert plan["fwd_resident_blocks"] == 24 and plan["fwd_tile_parallel"] and plan["fwd_blocks"] == 800
    # One SM (6 slots of 4-channel blocks): 2 sequential blocks walk 4 tiles in one wave (4 steps);
    # tile-parallel would take 3 passes x 2 waves.
    plan = EMULATION._launch_plan(1, 8, 2, 1, 40, 45, 1, limits["smem_per_sm"], limits["smem_per_block"], arch=90)
    assert plan["fwd_resident_blocks"] == 6 and not plan["fwd_tile_parallel"]


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_plan_matrix_reaches_every_plan_of_every_pass(device):
    """test_every_device_plan_matches_reference labels runs "sequential" / "tile-parallel" by the
    SM count it plans for; the planner decides by waves of resident slots, so check that over
    SHAPES each device still runs each pass (forward, backward) in both plans under the race
    detector, whatever the planner's thresholds become."""
    reached = set()
    for shape in SHAPES:
        for plan in PLANS:
            limits = _options(device, plan, order=0)
            launch = EMULATION._launch_plan(*shape[:6], limits["sm_count"], limits["smem_per_sm"],
                                              limits["smem_per_block"], arch=limits["arch"])
            reached |= {(p, launch[f"{p}_tile_parallel"]) for p in ("fwd", "bwd")}
    assert reached == {("fwd", False), ("fwd", True), ("bwd", False), ("bwd", True)}


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_plan_matrix_runs_every_kernel_variant_of_every_pass(device):
    """Each pass has a general kernel and one specialised for N = 1 in the sequential pass (the model
    shapes' plan); the emulation runs the variant the plan names (the same kernel_variant() choice
    as the GPU launchers), so SHAPES x PLANS must reach both variants of both passes on every
    device, and the specialised one exactly at N = 1 with one warp per channel, sequentially, in
    every dtype it is compiled for."""
    reached = set()
    for shape in SHAPES:
        for plan in PLANS:
            limits = _options(device, plan, order=0)
            launch = EMULATION._launch_plan(*shape[:6], limits["sm_count"], limits["smem_per_sm"],
                                              limits["smem_per_block"], arch=limits["arch"])
            for p in ("fwd", "bwd"):
                one_state = (shape[3] == 1 and launch[f"{p}_warps_per_channel"] == 1
                             and not launch[f"{p}_tile_parallel"])
                assert launch[f"{p}_variant"] == ("kOneStateSequential" if one_state else "kGeneral")
                reached.add((p, launch[f"{p}_variant"], shape[-1]))
    one_state = {(p, "kOneStateSequential", dtype) for p in ("fwd", "bwd")
                 for dtype in (torch.float32, torch.bfloat16, torch.float16)}
    general = {(p, v) for p, v, _ in reached if v == "kGeneral"}
    assert one_state <= reached and general == {("fwd", "kGeneral"), ("bwd", "kGeneral")}


# The optional inputs of the op (D, delta_bias, the softplus on delta) switch code in both passes;
# the model shapes always pass all three, so both kernel variants (the one-state one in the
# sequential plan: the model plan; the general one in the tile-parallel plan) also run without
# them here, in every dtype, under the race detector, on a map whose H * W is a multiple of 4
# (vector quads), one whose H * W is not (per-cell quads), and packed small maps with two channels
# per block (segment starts inside a tile; unused channel slots of the one-state blocks).
OPTIONAL_INPUTS = [  # (use_d, use_bias, softplus)
    (False, False, False),
    (False, True, True),
    (True, False, True),
]


@pytest.mark.parametrize("dim, groups, height, width", [(8, 2, 36, 40), (8, 2, 37, 41), (8, 4, 20, 30)])
@pytest.mark.parametrize("use_d, use_bias, softplus", OPTIONAL_INPUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("plan, variant", [("sequential", "kOneStateSequential"), ("tile-parallel", "kGeneral")])
def test_kernel_variants_without_optional_inputs_match_reference(plan, variant, dtype, use_d, use_bias,
                                                                 softplus, dim, groups, height, width):
    batch, nstate = 2, 1
    options = _options("sm90-H100", plan, order=7)
    launch = EMULATION._launch_plan(batch, dim, groups, nstate, height, width, options["sm_count"],
                                      options["smem_per_sm"], options["smem_per_block"], arch=options["arch"])
    single_tile = height <= 32 and width <= 32  # one tile: nothing to run in parallel
    expected = "kOneStateSequential" if single_tile else variant
    assert launch["fwd_variant"] == launch["bwd_variant"] == expected
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, use_d=use_d,
                         use_bias=use_bias, softplus=softplus, seed=3)
    assert (inputs["D"] is None) != use_d and (inputs["delta_bias"] is None) != use_bias
    half = dtype != torch.float32
    check_all(emulated_fwd, emulated_bwd, inputs, height, width, rtol=3e-2 if half else 5e-5,
              softplus=softplus, out_fp32=half, **options)


# The four-route op's kernels (cross_forward / cross_backward: one launch per route, each planned
# for its route's grid, Variant::kRoute / kOneStateRoute) through the same devices and plans.
# (batch, dim, N, height, width, dtype, routes): 2 x 2 tiles on every route's grid (33 x 36 and
# 36 x 33 the columns-first ones), shapes for which the one-SM "sequential" device walks the tiles
# in order and the full device runs them in parallel, in both passes and on every device. Rows-first
# and columns-first routes from each corner (the identity and the reversed route take the vector
# path on rows of whole quads); N = 1 and N = 3 (on some devices the backward's two warps per channel:
# a last state round with one state), fp32 and both 2-byte types.
ROUTE_SHAPES = [
    (3, 2, 1, 33, 36, torch.float32, [0, 4, 3, 7]),
    (3, 2, 1, 36, 33, torch.bfloat16, [0, 5, 3, 6]),
    (1, 2, 3, 36, 40, torch.float16, [3, 7, 1, 4]),
    (2, 1, 3, 33, 36, torch.float32, [6, 2, 5, 0]),
]


def _route_launches(device: str, plan: str, shape) -> list:
    """_launch_plan of each route launch of a ROUTE_SHAPES entry under _options(device, plan)."""
    batch, dim, nstate, height, width, _, routes = shape
    limits = _options(device, plan, order=0)
    return [EMULATION._launch_plan(batch, dim, 1, nstate, height, width, limits["sm_count"],
                                     limits["smem_per_sm"], limits["smem_per_block"], route=code,
                                     arch=limits["arch"])
            for code in routes]


def _route_shape_id(shape) -> str:
    *sizes, dtype, routes = shape
    return "x".join(map(str, sizes)) + "-" + str(dtype).replace("torch.", "") + "-r" + "".join(map(str, routes))


@pytest.mark.parametrize("shape", ROUTE_SHAPES, ids=_route_shape_id)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("device", list(DEVICES))
def test_route_kernels_on_every_device_plan_match_reference(device, plan, shape):
    from support.route_cases import check as check_routes, make_inputs as route_inputs

    batch, dim, nstate, height, width, dtype, routes = shape
    seed = list(DEVICES).index(device) * 10 + ROUTE_SHAPES.index(shape)
    half = dtype != torch.float32
    # Half types: fp32 and input-dtype y / dy alternate over the devices, as above.
    fp32_out = half and list(DEVICES).index(device) % 2 == 0
    limits = _options(device, plan, order=0)
    del limits["order"]  # check() runs both passes in shuffled orders of its seed
    check_routes(route_inputs(batch, dim, routes, nstate, height, width, dtype=dtype, seed=seed), routes,
                 rtol=3e-2 if half else 5e-5, seed=seed, out_fp32=fp32_out, dy_fp32=half and not fp32_out, **limits)


def _planned_route_kinds(device: str) -> set:
    """Every (pass, tile-parallel, variant) the planner chooses for a route launch on this device
    (its SM count or one SM) over a spread of shapes: the plans a route kernel can run."""
    kinds = set()
    for sm_count in (1, DEVICES[device]["sm_count"]):
        for batch, dim, height, width in ((1, 1, 8, 8), (2, 4, 40, 40), (64, 96, 56, 56), (1, 8, 200, 7)):
            for nstate in (1, 2, 3, 16, 64):
                for code in (0, 4, 3, 8):
                    launch = EMULATION._launch_plan(batch, dim, 1, nstate, height, width, sm_count,
                                                      DEVICES[device]["smem_per_sm"],
                                                      DEVICES[device]["smem_per_block"], route=code,
                                                      arch=DEVICES[device]["arch"])
                    kinds |= {(p, launch[f"{p}_tile_parallel"], launch[f"{p}_variant"]) for p in ("fwd", "bwd")}
    return kinds


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_route_matrix_runs_every_planned_route_kernel(device):
    """Every (pass, sequential / tile-parallel, kernel variant) the planner can choose for a route
    launch on the device -- the route tile-parallel backward included, and any route variant added
    later once the planner chooses it -- runs in test_route_kernels_on_every_device_plan_match_reference
    (so under the race detector), in fp32 and in a 2-byte type; and each of its labels holds for
    every route launch (a planner change that moves a shape off its plan fails here)."""
    planned = _planned_route_kinds(device)
    assert {(p, tp) for p, tp, _ in planned} == {("fwd", False), ("fwd", True), ("bwd", False), ("bwd", True)}
    reached = set()
    for shape in ROUTE_SHAPES:
        for plan in PLANS:
            for launch in _route_launches(device, plan, shape):
                for p in ("fwd", "bwd"):
                    assert launch[f"{p}_tile_parallel"] == (plan == "tile-parallel"), (device, plan, shape, p)
                    reached.add((p, launch[f"{p}_tile_parallel"], launch[f"{p}_variant"], shape[5].itemsize))
    for size in (4, 2):
        assert planned <= {(p, tp, v) for p, tp, v, s in reached if s == size}, (size, planned, reached)
