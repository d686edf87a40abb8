"""Launching the NVRTC-compiled CUDA kernels: the driver API on torch's current stream.

The host driver (``vmamba2d._C_nvrtc``, the nvcc build's argument checks, planner and launch
sequence, compiled by the C++ compiler alone) calls :class:`KernelLauncher` once per kernel launch
with the kernel's kind, dtype and variant, its grid, threads per block, dynamic shared memory and
its parameters as bytes. The launcher picks the table entry (cuda_kernels.KERNELS), gets its
image for the device's arch from the kernel cache (compiling it on a miss), loads it once per
device (``cuModuleLoadData``), opts the function into the device's shared memory and launches it
with ``cuLaunchKernel`` on ``torch.cuda.current_stream()``. Everything the CUDA driver is asked goes
through :class:`Driver`, so tests can record it without a GPU.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from vmamba2d.ops.compiled import kernel_cache, nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KernelSpec, kernel_spec

# Above this, a function must opt into its dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize).
DEFAULT_SMEM_LIMIT = 48 * 1024


class Driver:
    """The CUDA driver calls the launcher makes, over cuda.bindings.driver; each raises on an error."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self._driver = driver
        self._check(driver.cuInit(0), "cuInit")  # idempotent; torch's runtime has usually done it

    @staticmethod
    def _check(result, what: str):
        status, *values = result if isinstance(result, tuple) else (result,)
        if int(status) != 0:
            raise RuntimeError(f"vmamba2d: {what} failed: {status!r}")
        return values[0] if len(values) == 1 else values

    def device_attribute(self, device: int, name: str) -> int:
        attribute = getattr(self._driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        value = self._driver.cuDeviceGetAttribute(attribute, self._driver.CUdevice(device))
        return int(self._check(value, f"cuDeviceGetAttribute({name})"))

    def load_module(self, image: bytes):
        return self._check(self._driver.cuModuleLoadData(image), "cuModuleLoadData")

    def get_function(self, module, name: str):
        return self._check(self._driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")

    def set_max_dynamic_smem(self, function, smem: int) -> None:
        attribute = self._driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._check(self._driver.cuFuncSetAttribute(function, attribute, smem), "cuFuncSetAttribute")

    def launch(self, function, grid: Sequence[int], threads: int, smem: int, stream: int, params: int) -> None:
        self._check(self._driver.cuLaunchKernel(function, *grid, threads, 1, 1, smem,
                                                self._driver.CUstream(stream), params, 0), "cuLaunchKernel")


@dataclass(frozen=True)
class DeviceInfo:
    """What the planner and the launcher need of one GPU."""

    index: int
    arch: int  # compute capability x 10 of the device
    code_arch: int  # of the code that runs there: the cubin's arch, or the PTX's
    sm_count: int
    smem_per_block: int  # opt-in maximum of dynamic shared memory per block
    smem_per_sm: int
    reserved_smem_per_block: int


def spec_for_launch(kind: str, dtype: str, variant: str) -> KernelSpec:
    """The table entry of one launch of the host driver."""
    return kernel_spec("carry_scan" if kind == "carry_scan" else f"{kind}.{dtype}.{variant}")


class KernelLauncher:
    """Loads and launches the NVRTC kernels; the host driver calls it once per launch.

    ``stream_of`` gives the current stream handle of a device (torch's by default),
    ``device_arch`` a device's compute capability x 10, ``current_device`` the device the host
    driver's guard made current.
    """

    def __init__(self, driver: Optional[Driver] = None, cache_folder=None,
                 toolchain: Optional[nvrtc.Toolchain] = None,
                 current_device: Optional[Callable[[], int]] = None,
                 stream_of: Optional[Callable[[int], int]] = None,
                 device_arch: Optional[Callable[[int], int]] = None) -> None:
        import torch

        self._driver = driver  # the real one is made on first use (it loads libcuda)
        self._cache_folder = cache_folder
        self._toolchain = toolchain or nvrtc.find_toolchain()
        self._current_device = current_device or torch.cuda.current_device
        self._stream_of = stream_of or (lambda device: torch.cuda.current_stream(device).cuda_stream)
        self._device_arch = device_arch or (lambda device: _capability(torch.cuda.get_device_capability(device)))
        self._functions: dict[tuple[int, str], object] = {}
        self._devices: dict[int, DeviceInfo] = {}
        self._lock = threading.Lock()

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = Driver()
        return self._driver

    def device_info(self, device: int) -> DeviceInfo:
        """The device's limits and the arch of the code it runs (queried once)."""
        with self._lock:
            if device not in self._devices:
                arch = self._device_arch(device)
                attribute = self.driver.device_attribute
                self._devices[device] = DeviceInfo(
                    index=device, arch=arch, code_arch=nvrtc.target_for(arch, self._toolchain.archs).arch,
                    sm_count=attribute(device, "MULTIPROCESSOR_COUNT"),
                    smem_per_block=attribute(device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
                    smem_per_sm=attribute(device, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
                    reserved_smem_per_block=attribute(device, "RESERVED_SHARED_MEMORY_PER_BLOCK"))
            return self._devices[device]

    def function(self, device: int, spec: KernelSpec):
        """The loaded kernel ``spec`` on ``device`` (compiled or read from the cache, loaded once)."""
        key = (device, spec.name)
        with self._lock:
            if key in self._functions:
                return self._functions[key]
        info = self.device_info(device)
        compiled, _ = kernel_cache.get_kernel(spec, info.arch, self._cache_folder, self._toolchain)
        function = self.driver.get_function(self.driver.load_module(compiled.image), compiled.lowered_name)
        if info.smem_per_block > DEFAULT_SMEM_LIMIT:
            self.driver.set_max_dynamic_smem(function, info.smem_per_block)
        with self._lock:
            return self._functions.setdefault(key, function)

    def __call__(self, kind: str, dtype: str, variant: str, grid: Sequence[int], threads: int, smem: int,
                 args: Sequence[bytes]) -> None:
        """Launch one kernel on the current device's current stream (the host driver's call)."""
        self.launch(spec_for_launch(kind, dtype, variant), grid, threads, smem, args)

    def launch(self, spec: KernelSpec, grid: Sequence[int], threads: int, smem: int, args: Sequence[bytes]) -> None:
        """Launch the table entry ``spec`` (any KernelSpec: the v4 entries are built per plan) on the
        current device's current stream; ``args`` are the kernel's parameters as bytes, in order."""
        device = self._current_device()
        function = self.function(device, spec)
        buffers = [ctypes.create_string_buffer(bytes(arg), len(arg)) for arg in args]
        pointers = (ctypes.c_void_p * len(buffers))(*(ctypes.addressof(b) for b in buffers))
        self.driver.launch(function, tuple(grid), threads, smem, self._stream_of(device), ctypes.addressof(pointers))


def _capability(major_minor: tuple[int, int]) -> int:
    return major_minor[0] * 10 + major_minor[1]
