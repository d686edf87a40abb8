"""benchmarks/gpu_time.py: kernel kinds from real kernel names, the busy time of overlapping device
intervals against a brute-force count, and a hand-written Chrome trace read back by kind."""
from __future__ import annotations

import random

import pytest

from support.script_loading import load_benchmark


def _tool():
    return load_benchmark("gpu_time")


# Kernel names as CUDA, cuDNN, cuBLAS, PyTorch, Triton and our NVRTC / nvcc entries spell them.
NAMES = {
    "vmamba2d_rows_cross_forward": "scan forward (vmamba2d)",
    "void vmamba2d::scan2d::scan2d_forward_kernel<float, (vmamba2d::scan2d::Variant)0>(vmamba2d::scan2d::Params)":
        "scan forward (vmamba2d)",
    "void scan2d_backward_kernel<__nv_bfloat16, 2>(Params)": "scan backward (vmamba2d)",
    "vmamba2d_rows_backward": "scan backward (vmamba2d)",
    "scan2d_bwd_kernel": "scan backward (vmamba2d)",
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64": "convolution",
    "void cudnn::cnn::conv2d_grouped_direct_kernel<false, true, false>": "convolution",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1": "GEMM",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>": "GEMM",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": "layer norm",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>": "elementwise",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>": "copy / cast / layout",
    "void at::native::elementwise_kernel<128, 2, at::native::bfloat16_copy_kernel_cuda>": "copy / cast / layout",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>": "reduction",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>": "softmax / cross-entropy",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
    "some_kernel_nobody_named": "other kernels",
}


@pytest.mark.parametrize("name,kind", sorted(NAMES.items()))
def test_kernel_kind_of_real_names(name, kind):
    assert _tool().kernel_kind(name) == kind


def test_union_length_counts_overlaps_once():
    tool = _tool()
    rng = random.Random(0)
    for _ in range(200):
        intervals = [(s, s + rng.randint(0, 12)) for s in (rng.randint(0, 60) for _ in range(rng.randint(0, 8)))]
        covered = {t for start, end in intervals for t in range(start, end)}  # unit cells of the integer line
        assert tool.union_length(intervals) == len(covered)


def test_trace_read_back_by_kind_with_busy_and_wall_time():
    tool = _tool()
    events = [
        {"ph": "X", "cat": "kernel", "name": "vmamba2d_rows_cross_forward", "ts": 100.0, "dur": 40.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "ts": 150.0, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "ts": 155.0, "dur": 10.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 90.0, "dur": 5.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 0.0, "dur": 500.0},  # host: not device time
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1.0},  # not a complete event
    ]
    gpu = tool.gpu_time_from_trace({"traceEvents": events}, wall_us=200.0)
    assert gpu.kinds == {"scan forward (vmamba2d)": (1, 40.0), "GEMM": (2, 20.0), tool.MEMCPY: (1, 5.0)}
    assert gpu.busy_us == pytest.approx(5.0 + 40.0 + 15.0)  # the two GEMMs overlap by 5 us
    assert gpu.kernel_us == pytest.approx(65.0)
    assert [row[0] for row in gpu.rows()] == ["scan forward (vmamba2d)", "GEMM", tool.MEMCPY]
    assert tool.GpuTime.from_dict(gpu.as_dict()) == gpu
    table = "\n".join(tool.markdown_table("one inference call", gpu))
    assert "GPU busy 0.06 ms (30% of the wall time)" in table
    assert "| GEMM | 2 | 0.02 | 30.8% |" in table
