"""dev/gpu/bench_scan_cuda.py (the GPU benchmark of the scan): its shapes, byte counts, targets, report and
backend choice, exercised on the CPU (no GPU numbers are produced or checked here)."""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops.compiled import extensions

from support.cuda_emulation_build import v3_emulation
from support.script_loading import load_script


def _load_gpu_bench():
    return load_script("dev/gpu/bench_scan_cuda.py", "bench_scan_cuda")


def test_gpu_benchmark_shapes_are_design_section_7():
    gpu = _load_gpu_bench()
    shapes = gpu.default_shapes(["table3", "model"], gpu.TABLE3_MAPS)
    table3 = [(s.height, s.width, s.dim, s.groups, s.nstate) for s in shapes if s.family == "table3"]
    model = [(s.batch, s.height, s.dim, s.groups, s.nstate) for s in shapes if s.family == "model"]
    assert table3 == [(14, 14, 1, 1, 16), (56, 56, 1, 1, 16), (200, 200, 1, 1, 16)]
    assert model == [(128, 56, 384, 4, 1), (128, 28, 768, 4, 1), (128, 14, 1536, 4, 1), (128, 7, 3072, 4, 1)]


def test_bytes_moved_counts_each_tensor_once_and_b_c_per_group():
    gpu = _load_gpu_bench()
    shape = gpu.Shape("model", batch=128, dim=384, groups=4, nstate=1, height=56, width=56)
    length = 56 * 56
    per_channel_tensors = 3 * 128 * 384 * length  # u, delta read; y written
    per_group_tensors = 2 * 128 * 4 * 1 * length  # B, C read once per group
    params = 384 * 1 + 2 * 384  # A, D, delta_bias (fp32)
    assert gpu.bytes_moved(shape, torch.float32) == 4 * (per_channel_tensors + per_group_tensors + params)
    assert gpu.bytes_moved(shape, torch.bfloat16) == 2 * (per_channel_tensors + per_group_tensors) + 4 * params
    assert gpu.bytes_moved(shape, torch.bfloat16, torch.float32) == (
        2 * (2 * 128 * 384 * length + per_group_tensors) + 4 * 128 * 384 * length + 4 * params)


def test_targets_are_marked_from_the_measured_numbers():
    gpu = _load_gpu_bench()
    model = gpu.Shape("model", 2, 8, 4, 1, 4, 4)
    row = gpu.Row(model, "fp32", "cuda", bytes=700,
                  two_d=gpu.Timing(fwd_ms=1.0, train_ms=3.0, peak_train=110),
                  one_d=gpu.Timing(fwd_ms=0.95, train_ms=2.0, peak_train=100))
    mamba = gpu.Row(model, "fp32", "mamba_ssm (1D)", one_d=gpu.Timing(fwd_ms=0.5))
    derived = gpu.derive(row, copy_bytes_per_s=1000e3, mamba=mamba)  # 700 B in 1 ms = 70% of 1 MB/s
    assert derived.copy_share == pytest.approx(0.7) and derived.train_over_fwd == pytest.approx(3.0)
    assert derived.ratio_fwd == pytest.approx(0.95) and derived.ratio_train == pytest.approx(2 / 3)
    assert derived.memory_vs_1d == pytest.approx(1.1) and derived.vs_mamba == pytest.approx(0.5)
    assert derived.targets == {"T1": True, "T2": True, "T3": False, "T4": True}
    table3 = gpu.derive(gpu.Row(gpu.Shape("table3", 4, 1, 1, 16, 4, 4), "fp32", "cuda", bytes=1,
                                two_d=gpu.Timing(fwd_ms=1.0, train_ms=4.0)), 1.0, None)
    assert table3.targets == {"T1": None, "T2": False, "T3": None, "T4": None}  # T1: model shapes only


def test_gpu_benchmark_run_on_cpu_fills_every_column_it_can(capsys):
    """The measurement loop and report on CPU tensors (host clock; no peak memory, no targets T4)."""
    gpu = _load_gpu_bench()
    args = gpu.parse_args(["--warmup", "0", "--repeats", "1", "--copy-mb", "1", "--memory-limit-gb", "1"])
    shapes = [gpu.Shape("table3", 3, 1, 1, 4, 5, 6), gpu.Shape("model", 2, 8, 4, 1, 4, 4)]
    header, table = gpu.run(args, torch.device("cpu"), shapes, ["torch"], ["a note"])
    assert "not a GPU run" in header and "host clock" in header and "- a note" in header
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows] == [
        ("table3 5x6 x 3 maps", "fp32", "torch"), ("table3 5x6 x 3 maps", "bf16", "torch"),
        ("model 4x4 x 8 ch", "fp32", "torch"), ("model 4x4 x 8 ch", "bf16", "torch")]
    for r in rows:
        fwd, train, one_d_fwd, one_d_train, ratio_fwd = (float(r[i]) for i in (3, 4, 10, 11, 12))
        assert min(fwd, train, one_d_fwd, one_d_train) > 0, r
        assert ratio_fwd == pytest.approx(one_d_fwd / fwd, rel=0.02, abs=0.01), r
        assert r[9].strip() == "—" and r[20].strip() == "", r  # no CUDA peak memory on CPU; no error note


def test_gpu_benchmark_reports_a_failing_backend_instead_of_stopping():
    gpu = _load_gpu_bench()

    def broken():
        raise RuntimeError("no kernel image is available for execution on the device\nmore")

    timing = gpu._guarded(broken, torch.device("cpu"))
    assert timing.fwd_ms is None
    assert timing.note == "error: RuntimeError: no kernel image is available for execution on the device"


def test_gpu_benchmark_rows_are_the_backends_that_run_here(monkeypatch):
    gpu = _load_gpu_bench()
    monkeypatch.setattr(extensions, "cuda_extension", lambda: object())
    monkeypatch.setattr(extensions, "cuda_kernel_usable", lambda device: False)
    monkeypatch.setattr(extensions, "failure_reason", lambda kind: "no kernel image for sm_70")
    monkeypatch.setattr(gpu, "backend_info", lambda: {"triton": True})
    backends, notes = gpu.available_backends(torch.device("cuda", 0))
    assert backends == (["triton", "torch"] if "triton" in gpu.BACKENDS else ["torch"])
    assert any("cuda: not benchmarked (no kernel image for sm_70)" in note for note in notes)
    monkeypatch.setattr(extensions, "cuda_kernel_usable", lambda device: True)
    assert gpu.available_backends(torch.device("cuda", 0))[0][0] == "cuda"


def test_gpu_benchmark_plan_table_shows_every_shape_and_its_1d_path():
    bench = _load_gpu_bench()
    cuda_module = v3_emulation()  # the launch planner of _C_cuda, built with g++
    shapes = bench.default_shapes(["model", "table3"], bench.TABLE3_MAPS)
    h100 = bench.DeviceLimits(sm_count=132, smem_per_sm=228 * 1024, smem_per_block=227 * 1024, arch=90)
    table = bench.plan_table(shapes, h100, cuda_module).splitlines()
    assert len(table) == 2 + 2 * len(shapes)
    # vmamba2d_tiny's N = 1 calls on an H100: 4 channels per block, 128 threads, in both passes.
    cells = [cell.strip() for cell in table[2].strip("|").split("|")]
    assert cells[:2] == ["model 56x56 x 384 ch", "2D 56x56"]
    assert cells[2].startswith("4 x 1, 128,") and cells[4].startswith("4 x 1, 128,")


class _H100Launcher:
    """A stand-in kernel launcher for the NVRTC host driver: an H100's limits, no launches."""

    def __call__(self, *args):
        raise AssertionError("the plan table launches nothing")

    def device_info(self, index: int):
        from vmamba2d.ops.compiled.cuda_launch import DeviceInfo

        return DeviceInfo(index=index, arch=90, code_arch=90, sm_count=132, smem_per_block=227 * 1024,
                          smem_per_sm=228 * 1024, reserved_smem_per_block=1024)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_gpu_benchmark_plan_table_on_the_nvrtc_path_agrees_with_the_nvcc_builds_planner():
    """The 2026-11-29 run crashed here: the NVRTC backend has no _launch_plan. Its host driver's
    launch_shapes (the same planner compiled by the C++ compiler) fills the table, and each row's
    threads and shared memory are the ones the nvcc build's _launch_plan gives on the same GPU."""
    from vmamba2d.ops.compiled import nvrtc_backend

    bench = _load_gpu_bench()
    kernels = nvrtc_backend.NvrtcKernels(_H100Launcher())
    shapes = bench.default_shapes(["model", "table3"], bench.TABLE3_MAPS)
    h100 = bench.DeviceLimits(sm_count=132, smem_per_sm=228 * 1024, smem_per_block=227 * 1024, arch=90)
    table = bench.plan_table(shapes, h100, kernels).splitlines()
    assert len(table) == 2 + 2 * len(shapes) and "no plan" not in "\n".join(table)
    nvcc = bench.plan_table(shapes, h100, v3_emulation()).splitlines()
    for row, planned in zip(table[2:], nvcc[2:]):
        shape, fwd, bwd = _cells(row)[:2], _cells(row)[2], _cells(row)[3]
        assert shape == _cells(planned)[:2]
        # "grid, threads, smem KiB, variant" against "channels x warps, threads, smem KiB, warps/SM"
        assert fwd.split(", ")[1:3] == _cells(planned)[2].split(", ")[1:3], (row, planned)
        assert bwd.split(", ")[1:3] == _cells(planned)[4].split(", ")[1:3], (row, planned)


def test_gpu_benchmark_plan_table_says_why_a_row_has_no_plan():
    bench = _load_gpu_bench()
    shapes = bench.default_shapes(["model"], bench.TABLE3_MAPS)
    limits = bench.DeviceLimits(sm_count=132, smem_per_sm=228 * 1024, smem_per_block=227 * 1024, arch=90)
    table = bench.plan_table(shapes, limits, object()).splitlines()  # a module with neither planner
    assert len(table) == 2 + 2 * len(shapes)
    assert all("no plan: AttributeError" in row and "launch_shapes" in row for row in table[2:])

    class RefusesOneD:
        def launch_shapes(self, batch, dim, groups, nstate, height, width, device):
            if height == 1:
                raise ValueError("one row\nmore")
            return {"forward": ((1, 2, 3), 128, 2048, "kGeneral"), "backward": ((4, 5, 6), 64, 1024, "kRoute")}

    table = bench.plan_table(shapes, limits, RefusesOneD()).splitlines()
    assert _cells(table[2])[2:] == ["1 x 2 x 3, 128, 2.0 KiB, kGeneral", "4 x 5 x 6, 64, 1.0 KiB, kRoute"]
    assert _cells(table[3])[2:] == ["no plan: ValueError: one row", ""]
