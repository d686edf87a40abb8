"""The CUDA 2D selective-scan kernels (compiled by NVRTC at first use, or the nvcc-built
vmamba2d._C_cuda where VMAMBA2D_NVCC_BUILD=1 built it).

Three layers:
  * availability: a CUDA build of torch finds the kernels without nvcc (no GPU needed);
  * emulation (CPU, no GPU): the kernel's own block code (csrc/cuda/scan2d_kernel.cuh) run thread
    by thread on the CPU through the test-only host emulation built by the C++ compiler alone
    (tests/support/cuda_emulation_build.py: ``_emulate_forward/_backward``) in forward, reversed and
    shuffled thread / warp / lane / block order, under the shared-memory race detector and bounds
    checks, with shared memory and scratch poisoned with NaN, against an independent fp64
    reference (the vectorised PyTorch scan and its autograd); tests/ops/compiled/test_cuda_emulation_checks.py
    covers the checker itself, barrier removal and determinism;
  * GPU (``-m cuda``, skipped without a GPU): the real kernel against the same reference, the CPU
    kernel, every dtype, large and odd maps, saved carries, bitwise determinism, streams.
"""
from __future__ import annotations

import importlib

import pytest
import torch


from vmamba2d.ops import backend_info, selective_scan_2d
from vmamba2d.ops.compiled import extensions
from support.v3_cases import EMULATION, ORDER, QUADS_PER_TILE, assert_close, check_all, emulated_bwd, emulated_fwd, emulated_vector_accesses, gpu_kernels, make_inputs, needs_gpu, offset_by_one, reference









# --------------------------------------------------------------------------------------------
# inputs and the fp64 reference












# --------------------------------------------------------------------------------------------
# build / import (no GPU needed)


@pytest.mark.skipif(torch.version.cuda is None, reason="CPU-only torch: no CUDA kernels")
def test_cuda_kernels_are_available_without_nvcc():
    try:
        importlib.import_module("vmamba2d._C_cuda")
        expected = "nvcc"  # a developer build with VMAMBA2D_NVCC_BUILD=1
    except ImportError:
        expected = "nvrtc"
    info = backend_info()
    assert info["cuda_extension"] is True and info["cuda_compiler"] == expected, info
    assert info["nvrtc_version"] is not None, info
    for name in ("forward", "backward", "cross_forward", "cross_backward"):
        assert callable(getattr(extensions.cuda_extension(), name))


@pytest.mark.skipif(torch.version.cuda is None, reason="CPU-only torch: no CUDA kernels")
def test_cuda_entry_points_reject_cpu_tensors():
    x = make_inputs(1, 2, 1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        extensions.cuda_extension().forward(*(x[k] for k in ORDER), True, 3, 4, False, False)


# --------------------------------------------------------------------------------------------
# the kernel code emulated on the CPU

# (batch, dim, groups, N, height, width, dtype): packed small maps (several batch entries per tile,
# partly filled; N = 1 with 4 channels side by side = 128 threads), a single partial tile, several
# tiles with partial edges, 1xL / Lx1 maps (maps stacked across the tile, tiled along L; 37 maps =
# one full and one partial batch block), short-wide / tall-narrow maps, 33x65, groups > 1,
# N in {1, 2, 4, 16, 64}, fp16 / bf16, odd batches; a few-map N = 1 shape (one 40x70 map, 4
# channels side by side in the forward and the backward) that runs tile-parallel.
EMULATED_SHAPES = [
    (5, 4, 2, 1, 7, 7, torch.float32),
    (3, 8, 2, 1, 14, 14, torch.float32),
    (3, 2, 1, 2, 1, 1, torch.float32),
    (2, 2, 1, 4, 13, 29, torch.float32),
    (2, 4, 2, 3, 40, 70, torch.float32),
    (37, 2, 1, 4, 1, 100, torch.float32),
    (3, 2, 1, 2, 100, 1, torch.float32),
    (5, 2, 1, 3, 6, 75, torch.float32),
    (3, 2, 1, 3, 75, 6, torch.float32),
    (1, 2, 1, 16, 33, 65, torch.float32),
    (3, 6, 3, 2, 33, 20, torch.float32),
    (3, 2, 1, 64, 9, 9, torch.float32),
    (1, 1, 1, 64, 33, 34, torch.float32),
    (3, 4, 2, 4, 36, 10, torch.float16),
    (5, 8, 2, 1, 20, 45, torch.bfloat16),
    (1, 4, 1, 1, 40, 70, torch.float32),
]
# Every phase in forward (0), reversed (1) and shuffled (>= 2, the seed) thread / warp / lane /
# block order; the shapes take turns.
ORDERS = (0, 1, 2, 7)






def shape_id(shape):
    return "x".join(map(str, shape[:-1])) + "-" + str(shape[-1]).replace("torch.", "")


DTYPES = (torch.float32, torch.float16, torch.bfloat16)
RTOL = {torch.float32: 5e-5, torch.float16: 3e-2, torch.bfloat16: 6e-2}


@pytest.mark.parametrize("index", range(len(EMULATED_SHAPES)),
                         ids=[shape_id(s) for s in EMULATED_SHAPES])
def test_emulated_kernel_matches_reference(index):
    batch, dim, groups, nstate, height, width, dtype = EMULATED_SHAPES[index]
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, seed=index)
    half = dtype != torch.float32
    # The planned device: 1 SM -> the backward keeps a group's channels in one block and walks each
    # map's tiles (so does the forward, unless the SM's resident slots run its few blocks' tiles
    # faster in parallel); 1000 SMs -> maps of 4 or more tiles run tile-parallel (three passes) and
    # the backward splits groups into channel slices (partial dB / dC buffers summed in order). Every
    # third shape is planned for 228 KB SMs (H100), the others for 164 KB (A100): block shapes
    # differ, e.g. 4 instead of 3 channels per backward block at N = 1 with 96 channels per group.
    check_all(emulated_fwd, emulated_bwd, inputs, height, width, rtol=3e-2 if half else 5e-5,
              dy_fp32=half, out_fp32=half, order=ORDERS[index % len(ORDERS)],
              sm_count=1000 if index % 2 else 1,
              smem_per_sm=(228 if index % 3 == 0 else 164) * 1024)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_emulated_kernel_without_optional_inputs_and_softplus(dtype):
    # N = 3 on 2 channels per group: 2 warps per channel, so 2 state rounds, the last one half full.
    inputs = make_inputs(2, 4, 2, 3, 35, 20, dtype=dtype, use_d=False, use_bias=False, softplus=False,
                         seed=7)
    check_all(emulated_fwd, emulated_bwd, inputs, 35, 20, rtol=RTOL[dtype], softplus=False, order=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 4, 1, 5, 40, 45), (3, 2, 1, 3, 20, 20)],
                         ids=lambda shape: "x".join(map(str, shape)))
def test_emulated_kernel_state_rounds_in_every_dtype(shape, dtype):
    # More states than warps per channel (several rounds, the last one partly filled), on a map
    # of 2x2 tiles and on packed single-tile maps; half inputs with fp32 and half y / dy.
    batch, dim, groups, nstate, height, width = shape
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, seed=nstate)
    half = dtype != torch.float32
    check_all(emulated_fwd, emulated_bwd, inputs, height, width, rtol=RTOL[dtype], order=4,
              dy_fp32=half and nstate == 5, out_fp32=half and nstate == 3)


def test_kernel_softplus_is_within_its_error_bound():
    # The kernels' fast softplus (exp2 / log2 and a short series, scan2d_tile.cuh) against
    # log1p(exp(z)) in float64: relative error <= 1e-5 wherever the result is a normal float
    # (z >= -87), dense around its branch points (t = 2^-5 at z = -3.47, z = 0, the threshold 20).
    z = torch.cat([torch.linspace(-87.0, 30.0, 200_001), torch.linspace(-3.6, -3.3, 20_001),
                   torch.linspace(-1e-3, 1e-3, 2_001), torch.linspace(19.99, 20.01, 2_001),
                   torch.tensor([-0.0, 0.0, 1e-30, -1e-30])])
    got = EMULATION._softplus(z).double()
    exact = torch.where(z.double() > 20, z.double(), torch.log1p(torch.exp(z.double())))
    relative = ((got - exact).abs() / exact).max().item()
    assert relative <= 1e-5, relative
    assert torch.equal(EMULATION._softplus(torch.tensor([20.5, 1e4])), torch.tensor([20.5, 1e4]))


def test_kernel_softplus_gradient_is_within_its_error_bound():
    # sigmoid(z) from dt = softplus(z) (the backward's ddelta factor): series below dt = 2^-5,
    # 1 - exp(-dt) above, against -expm1(-dt) in float64: relative error <= 1e-5 from dt = 1e-30
    # to where sigmoid rounds to 1, dense around the switch; 0 on padding cells (dt = 0).
    dt = torch.cat([torch.logspace(-30, 1.5, 200_001), torch.linspace(0.030, 0.033, 20_001)])
    got = EMULATION._softplus_grad_from_value(dt).double()
    exact = -torch.expm1(-dt.double())
    relative = ((got - exact).abs() / exact).max().item()
    assert relative <= 1e-5, relative
    assert EMULATION._softplus_grad_from_value(torch.zeros(1)).item() == 0.0


def test_kernel_sigmoid_from_softplus_is_within_its_error_bound():
    # The N = 1 backward's ddelta factor sigmoid(z) = exp(z - softplus(z)) (no dt tile: dt is
    # recomputed from delta) against torch.sigmoid in float64: relative error <= 1e-5 wherever
    # sigmoid is a normal float (z >= -87), dense around softplus's branch points.
    z = torch.cat([torch.linspace(-87.0, 40.0, 200_001), torch.linspace(-3.6, -3.3, 20_001),
                   torch.linspace(-1e-3, 1e-3, 2_001), torch.linspace(19.99, 20.01, 2_001),
                   torch.tensor([-0.0, 0.0, 1e-30, -1e-30])])
    got = EMULATION._sigmoid_from_softplus(z).double()
    exact = torch.sigmoid(z.double())
    relative = ((got - exact).abs() / exact).max().item()
    assert relative <= 1e-5, relative


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_emulated_kernel_softplus_passes_large_arguments_through(dtype):
    # torch's softplus returns z itself above its threshold 20: delta + bias on both sides of it.
    inputs = make_inputs(2, 4, 1, 2, 20, 40, dtype=dtype, seed=21)
    inputs["delta_bias"] = torch.tensor([18.0, 19.9, 20.3, 23.0])
    check_all(emulated_fwd, emulated_bwd, inputs, 20, 40, rtol=RTOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_emulated_tile_parallel_passes_with_several_state_rounds(dtype):
    # One 70x70 map (3x3 tiles) and N = 6 on 4 channels: both passes run tile-parallel (1000 SMs),
    # and their edge passes loop over state rounds, with a barrier between rounds.
    inputs = make_inputs(1, 4, 1, 6, 70, 70, dtype=dtype, seed=23)
    check_all(emulated_fwd, emulated_bwd, inputs, 70, 70, rtol=RTOL[dtype], order=6, sm_count=1000)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_emulated_kernel_half_outputs_in_input_dtype(dtype):
    # y and dy in the inputs' half dtype (no fp32 upcast): the kernel's rounding on store.
    inputs = make_inputs(3, 2, 1, 2, 20, 40, dtype=dtype, seed=5)
    check_all(emulated_fwd, emulated_bwd, inputs, 20, 40, rtol=3e-2 if dtype == torch.float16 else 6e-2)








def test_emulated_aligned_tiles_move_every_quad_as_one_vector():
    # 32x32 fp32 maps, N = 1, the group's 4 channels in one block: every row starts 16-byte
    # aligned, so every quad is one vector access, and B / C quads are loaded once per block, not
    # per channel. Forward: per channel delta, u loads, u again for y = D * u after the scans (one
    # state round keeps no y tile) + y stores; per block B, C loads. Backward:
    # per channel delta, u, dy loads and dt parked in the ddelta quad, delta, u, dy and the parked
    # dt read again in the last phase (one state keeps no dt / u / dy tiles) + du, ddelta stores;
    # per block B, C loads, B again in the last phase (no B tile at N = 1) and one vector
    # read-modify-write (2 accesses) each of the dB and dC partials.
    batch, dim = 1, 4
    inputs = make_inputs(batch, dim, 1, 1, 32, 32, seed=11)
    fwd, bwd = emulated_vector_accesses(inputs, 32, 32, sm_count=1)
    assert fwd == batch * (dim * 4 + 2) * QUADS_PER_TILE
    assert bwd == batch * (dim * 10 + 3 + 4) * QUADS_PER_TILE


def test_emulated_blocks_share_b_and_c_quads_between_channels_at_many_states():
    # N = 16, 4 channels, on an H100's shared memory: the plan puts 2 channels in a block (2 warps
    # each) in both passes, so each B / C quad is loaded once per 2 channels. Forward per block:
    # per channel delta, u loads + y stores, per state B and C loads. Backward per block: per
    # channel delta, u, dy loads + du, ddelta stores; per state B, C loads + dB, dC vector adds.
    dim, nstate, blocks = 4, 16, 2
    inputs = make_inputs(1, dim, 1, nstate, 32, 32, seed=14)
    fwd, bwd = emulated_vector_accesses(inputs, 32, 32, sm_count=132, smem_per_sm=228 * 1024,
                                         smem_per_block=227 * 1024)
    assert fwd == (dim * 3 + blocks * nstate * 2) * QUADS_PER_TILE
    assert bwd == (dim * 5 + blocks * nstate * (2 + 4)) * QUADS_PER_TILE


def test_emulated_misaligned_inputs_take_the_scalar_path():
    # The same maps with u, delta, B, C one element off 16-byte alignment: no input quad may be
    # vector-loaded (the emulation fails on a misaligned vector access); the forward's fresh y stays
    # aligned, so only its quads are vector accesses. The backward moves all the planes of a quad
    # together (vector only when every one is aligned): none of its accesses is a vector one.
    batch, dim = 1, 4
    inputs = make_inputs(batch, dim, 1, 1, 32, 32, seed=12)
    for name in ("u", "delta", "B", "C"):
        inputs[name] = offset_by_one(inputs[name])
        assert inputs[name].is_contiguous() and inputs[name].storage_offset() == 1
    fwd, bwd = emulated_vector_accesses(inputs, 32, 32, sm_count=1, order=2)
    assert fwd == batch * dim * QUADS_PER_TILE
    assert bwd == 0


@pytest.mark.parametrize("shape", [
    (2, 4, 1, 1, 33, 65, torch.float16),   # rows of odd width: aligned only every fourth row
    (7, 4, 2, 1, 5, 6, torch.bfloat16),    # packed 5x6 maps: quads straddle map boundaries
    (9, 2, 1, 4, 8, 8, torch.float32),     # packed 8x8 maps: whole quads inside each map
    (37, 2, 1, 2, 1, 50, torch.float16),   # 1 x L maps stacked across the tile
], ids=shape_id)
def test_emulated_mixed_vector_and_scalar_quads(shape):
    batch, dim, groups, nstate, height, width, dtype = shape
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, seed=13)
    half = dtype != torch.float32
    fwd, bwd = emulated_vector_accesses(inputs, height, width, rtol=3e-2 if half else 5e-5,
                                         dy_fp32=half, out_fp32=half, order=7, sm_count=1)
    assert fwd > 0, "no forward vector access taken"
    # The backward moves all the planes of a quad together: a map of H * W not a multiple of 4
    # leaves the channels' planes mutually misaligned, so only the per-cell path runs there.
    assert (bwd > 0) == (height * width % 4 == 0), f"backward vector accesses: {bwd}"


# --------------------------------------------------------------------------------------------
# GPU


def cuda_fwd(*args):
    return gpu_kernels().forward(*args)


def cuda_bwd(*args):
    return gpu_kernels().backward(*args)


TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 6e-2}

GPU_SHAPES = [
    (5, 4, 2, 16, 7, 7),
    (3, 4, 1, 16, 14, 14),
    (2, 2, 1, 1, 13, 29),
    (2, 4, 2, 64, 40, 70),
    (40, 2, 1, 16, 1, 300),
    (3, 2, 1, 16, 300, 1),
    (5, 2, 2, 16, 6, 75),
    (1, 2, 1, 16, 200, 200),
    (1, 2, 2, 1, 128, 512),
]


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_kernel_matches_reference(shape, dtype):
    batch, dim, groups, nstate, height, width = shape
    inputs = make_inputs(batch, dim, groups, nstate, height, width, dtype=dtype, device="cuda",
                         seed=sum(shape))
    check_all(cuda_fwd, cuda_bwd, inputs, height, width, rtol=TOLERANCE[dtype])


@pytest.mark.cuda
@needs_gpu
def test_gpu_fp32_output_and_fp32_dy_with_bf16_inputs():
    inputs = make_inputs(2, 4, 2, 16, 33, 45, dtype=torch.bfloat16, device="cuda", seed=5)
    check_all(cuda_fwd, cuda_bwd, inputs, 33, 45, rtol=TOLERANCE[torch.bfloat16], out_fp32=True,
              dy_fp32=True)


@pytest.mark.cuda
@needs_gpu
def test_gpu_without_optional_inputs_and_softplus():
    inputs = make_inputs(2, 4, 2, 4, 50, 31, device="cuda", use_d=False, use_bias=False,
                         softplus=False, seed=9)
    check_all(cuda_fwd, cuda_bwd, inputs, 50, 31, rtol=1e-4, softplus=False)


@pytest.mark.cuda
@needs_gpu
def test_gpu_output_fully_written_over_poisoned_memory():
    # Fill the caching allocator's blocks with NaN so y / du / ddelta start as NaN if reused;
    # every element must come back finite and equal to the reference.
    for _ in range(3):
        junk = torch.full((1 << 22,), float("nan"), device="cuda")
        del junk
    inputs = make_inputs(3, 4, 2, 16, 45, 37, device="cuda", seed=13)
    check_all(cuda_fwd, cuda_bwd, inputs, 45, 37, rtol=1e-4)


@pytest.mark.cuda
@needs_gpu
def test_gpu_matches_cpu_kernel_on_identical_inputs():
    if not backend_info()["cpu_extension"]:
        pytest.skip("the CPU kernel is unavailable")
    inputs = make_inputs(2, 4, 2, 16, 24, 70, device="cuda", seed=17)
    args = [inputs[k] for k in ORDER]
    cpu_args = [None if t is None else t.cpu() for t in args]
    y_gpu = selective_scan_2d(*args, height=24, width=70, backend="cuda")
    y_cpu = selective_scan_2d(*cpu_args, height=24, width=70, backend="cpu")
    assert_close("y gpu vs cpu", y_gpu, y_cpu.double(), 1e-4)


@pytest.mark.cuda
@needs_gpu
def test_gpu_public_op_non_contiguous_inputs_and_autograd():
    batch, dim, groups, nstate, height, width = 2, 4, 2, 16, 20, 45
    base = make_inputs(batch, dim, groups, nstate, height, width, device="cuda", seed=19)
    # Non-contiguous u / delta / B / C: transposed storage with the same values.
    nc = {k: v for k, v in base.items()}
    for k in ("u", "delta"):
        nc[k] = base[k].transpose(1, 2).contiguous().transpose(1, 2)
    for k in ("B", "C"):
        nc[k] = base[k].transpose(2, 3).contiguous().transpose(2, 3)
    assert not nc["u"].is_contiguous() and not nc["B"].is_contiguous()
    leaves = {k: None if v is None else v.clone().requires_grad_() for k, v in nc.items()}
    y = selective_scan_2d(*(leaves[k] for k in ORDER), height=height, width=width, backend="cuda")
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).cuda()
    y.backward(dy)
    y_ref, grads_ref = reference(base, dy, height, width)
    assert_close("y", y, y_ref, 1e-4)
    for k, ref in zip(ORDER, grads_ref):
        assert_close("d" + k, leaves[k].grad, ref, 1e-4)


@pytest.mark.cuda
@needs_gpu
def test_gpu_backward_is_bitwise_reproducible():
    # 2 groups x 4 channels: dB / dC are shared by the channels of a group (the old race case).
    inputs = make_inputs(3, 8, 2, 16, 40, 40, device="cuda", seed=23)
    args = [inputs[k] for k in ORDER]
    dy = torch.randn(3, 8, 1600, generator=torch.Generator().manual_seed(4)).cuda()
    _, carry_h, carry_v = gpu_kernels().forward(*args, True, 40, 40, False, True)
    first = gpu_kernels().backward(*args, True, 40, 40, dy, carry_h, carry_v)
    second = gpu_kernels().backward(*args, True, 40, 40, dy, carry_h, carry_v)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.cuda
@needs_gpu
def test_gpu_backward_from_saved_carries_equals_recording_backward():
    inputs = make_inputs(2, 4, 2, 4, 70, 45, device="cuda", seed=31)
    args = [inputs[k] for k in ORDER]
    y, carry_h, carry_v = gpu_kernels().forward(*args, True, 70, 45, False, True)
    y_plain, none_h, none_v = gpu_kernels().forward(*args, True, 70, 45, False, False)
    assert torch.equal(y, y_plain) and none_h.numel() == 0 and none_v.numel() == 0
    dy = torch.randn_like(y)
    empty = torch.empty(0, device="cuda")
    saved = gpu_kernels().backward(*args, True, 70, 45, dy, carry_h, carry_v)
    recorded = gpu_kernels().backward(*args, True, 70, 45, dy, empty, empty)
    for a, b in zip(saved, recorded):
        assert torch.equal(a, b)


@pytest.mark.cuda
@needs_gpu
def test_gpu_respects_current_stream():
    inputs = make_inputs(4, 4, 1, 16, 64, 64, device="cuda", seed=29)
    args = [inputs[k] for k in ORDER]
    expected = gpu_kernels().forward(*args, True, 64, 64, False, False)[0]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = gpu_kernels().forward(*args, True, 64, 64, False, False)[0]
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(y, expected)
