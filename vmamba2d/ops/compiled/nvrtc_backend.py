"""The CUDA scan through NVRTC: the host driver extension plus the kernel launcher, as one object
with the nvcc extension's functions (forward, backward, cross_forward, cross_backward,
kernel_image_available, kernel_image_arch), so the ops call either the same way.

The host driver ``vmamba2d._C_nvrtc`` (csrc/nvrtc/selective_scan_2d_nvrtc.cpp) needs only the C++
compiler: setup.py builds it where torch is importable at build time, else it is JIT-compiled here
on first use from the sources a wheel carries (vmamba2d/csrc) or a checkout has (csrc).
"""
from __future__ import annotations

import functools
import hashlib
import importlib
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

from vmamba2d.ops.compiled import cross_rows_backward, cross_rows_launch, nvrtc, rows_launch, rows_route_backward
from vmamba2d.ops.delta_proj import project_delta
from vmamba2d.ops.compiled.cuda_launch import KernelLauncher

HOST_SOURCE = Path("nvrtc") / "selective_scan_2d_nvrtc.cpp"
HOST_CXX_FLAGS = ["-O2", "-std=c++20"]


def host_source_files(kernel_dir: Path) -> list[Path]:
    """The host driver's source and every header of csrc/cuda it includes (for the JIT build's name)."""
    source = kernel_dir.parent / HOST_SOURCE
    closure = nvrtc.source_closure(str(Path("..") / HOST_SOURCE), kernel_dir)
    return [source] + sorted(kernel_dir / name for name in closure if not name.startswith(".."))


def _jit_name(kernel_dir: Path) -> str:
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in host_source_files(kernel_dir):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"vmamba2d_C_nvrtc_{digest.hexdigest()[:16]}"


@functools.lru_cache(maxsize=None)
def host_extension() -> ModuleType:
    """``vmamba2d._C_nvrtc`` as built, else its JIT build (once per process; minutes the first time)."""
    try:
        return importlib.import_module("vmamba2d._C_nvrtc")
    except ImportError:
        pass
    from torch.utils.cpp_extension import load

    kernel_dir = nvrtc.find_toolchain().kernel_dir
    print("vmamba2d: compiling the CUDA kernels' host driver (C++ compiler, no nvcc), about a minute, once")
    return load(name=_jit_name(kernel_dir), sources=[str(kernel_dir.parent / HOST_SOURCE)],
                extra_include_paths=[str(kernel_dir)], extra_cflags=HOST_CXX_FLAGS, verbose=False)


class NvrtcKernels:
    """The nvcc extension's interface over the host driver and the NVRTC kernel launcher.

    ``host`` builds the host driver extension on first use (a kernel call), not before, so
    asking whether the path is available compiles nothing.
    """

    def __init__(self, launcher: KernelLauncher, host=host_extension) -> None:
        self._launcher = launcher
        self._build_host = host
        self._host: Optional[ModuleType] = None
        self._limits_set: set[int] = set()

    @property
    def launcher(self) -> KernelLauncher:
        """The kernel launcher (its device_info; the v4 launch functions take it)."""
        return self._launcher

    def _prepare_for(self, u) -> ModuleType:
        """The host driver, set up for u's GPU; a tensor elsewhere is refused before any device query."""
        if not u.is_cuda:
            raise RuntimeError(f"vmamba2d CUDA kernels: u must be a CUDA tensor, got {u.device}")
        return self._prepare(u.device.index)

    def _prepare(self, device_index: Optional[int]) -> ModuleType:
        import torch

        if self._host is None:
            host = self._build_host()
            host.set_launcher(self._launcher)
            self._host = host
        index = torch.cuda.current_device() if device_index is None else device_index
        if index not in self._limits_set:
            info = self._launcher.device_info(index)
            self._host.set_device_limits(index, info.sm_count, info.smem_per_block, info.smem_per_sm,
                                         info.code_arch, info.reserved_smem_per_block)
            self._limits_set.add(index)
        return self._host

    def forward(self, u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32, save_carries):
        """The single-route forward: the v4 PL or RS kernel where rows_launch.forward_design picks it
        (N = 1, no gradient, maps of at most 64 cells / widths the RS plan covers), else the v3 kernel
        through the host driver."""
        if not u.is_cuda:
            self._prepare_for(u)  # raises: a tensor off the GPU is refused before any device query
        with torch.cuda.device(u.device):
            y = rows_launch.launch_forward(self._launcher, self._launcher.device_info(u.device.index), u, delta, A, B,
                                           C, D, delta_bias, delta_softplus, height, width, out_fp32, save_carries)
        if y is None:
            return self._prepare_for(u).forward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width,
                                                out_fp32, save_carries)
        empty = A.new_empty(0, dtype=torch.float32)
        return y, empty, empty.clone()

    def backward(self, u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy, carry_h, carry_v):
        """The single-route backward: the RS saving forward and backward where
        rows_route_backward.backward_design picks them (VMAMBA2D_SCAN_BACKWARD=auto and the rule), else
        the v3 kernel through the host driver (reading the forward's carries)."""
        if not u.is_cuda:
            self._prepare_for(u)  # raises: a tensor off the GPU is refused before any device query
        grads = rows_route_backward.launch_backward(self._launcher, u, delta, A, B, C, D, delta_bias, delta_softplus,
                                                    height, width, dy)
        if grads is not None:
            return grads
        return self._prepare_for(u).backward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy,
                                             carry_h, carry_v)

    def cross_folds(self, u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight) -> bool:
        """Whether :meth:`cross_forward` folds the step-size projection ``delta_proj_weight`` (K, dim, R)
        of the low-rank delta (batch, K, R, H, W) into the four-route kernel (cross_rows_launch.folds:
        rows_plan.fold_rule); where not, the caller may project first itself."""
        return cross_rows_launch.folds(u, delta, A, B, C, D, delta_bias, routes, out_fp32, delta_proj_weight)

    def cross_forward(self, u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32,
                      delta_proj_weight=None):
        """The four-route forward: the v4 four-route RS kernel where cross_rows_launch.cross_forward_design
        picks it (VMamba's cross routes, N = 1, W the plan covers), else v3's per-route kernels through
        the host driver. With ``delta_proj_weight`` (K, dim, R) delta is the low-rank (batch, K, R, H,
        W): the folding kernel projects it where :meth:`cross_folds` says so, else it is projected
        first (vmamba2d.ops.delta_proj.project_delta) and the call runs as a full-rank one."""
        if not u.is_cuda:
            self._prepare_for(u)  # raises: a tensor off the GPU is refused before any device query
        if delta_proj_weight is not None and not self.cross_folds(u, delta, A, B, C, D, delta_bias, routes, out_fp32,
                                                                  delta_proj_weight):
            delta, delta_proj_weight = project_delta(delta, delta_proj_weight), None
        with torch.cuda.device(u.device):
            y = cross_rows_launch.launch_forward(self._launcher, u, delta, A, B, C, D, delta_bias, delta_softplus,
                                                 routes, out_fp32, delta_proj_weight)
        if y is None:
            return self._prepare_for(u).cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes,
                                                      out_fp32)
        return y

    def cross_backward(self, u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy):
        """The four-route backward (full-rank delta): the RS route passes where
        cross_rows_backward.backward_design picks them (VMAMBA2D_SCAN_BACKWARD=auto and the rule), else
        v3's per-route kernels through the host driver."""
        if not u.is_cuda:
            self._prepare_for(u)  # raises: a tensor off the GPU is refused before any device query
        grads = cross_rows_backward.launch_backward(self._launcher, u, delta, A, B, C, D, delta_bias, delta_softplus,
                                                    routes, dy)
        if grads is not None:
            return grads
        return self._prepare_for(u).cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy)

    def kernel_image_available(self, device_index: int) -> bool:
        """True when NVRTC can produce code this GPU runs (a cubin, or PTX for a newer GPU) and the
        host driver is built (built here on first ask, so that a failed build is a fallback with
        its reason, not an error in the first op call).

        Raises:
            RuntimeError: the host driver could not be built (the message says why).
        """
        try:
            self._launcher.device_info(device_index)
        except ValueError:  # older than every arch this NVRTC targets
            return False
        try:
            self._prepare(device_index)
        except Exception as err:
            raise RuntimeError(f"the NVRTC path's host driver (vmamba2d._C_nvrtc) could not be built: {err}") from err
        return True

    def launch_shapes(self, batch: int, dim: int, groups: int, nstate: int, height: int, width: int,
                      device_index: int) -> dict:
        """How the host driver launches the v3 kernels for these shapes on GPU ``device_index`` (its
        planner, on that GPU's limits): ``forward`` / ``backward`` = ((grid x, y, z), threads per
        block, dynamic shared memory bytes, kernel variant) of each pass's main grid. The nvcc
        build's counterpart is its ``_launch_plan``; the v4 forwards plan in rows_launch /
        cross_rows_launch."""
        return self._prepare(device_index).launch_shapes(batch, dim, groups, nstate, height, width, device_index)

    def kernel_image_arch(self, device_index: int) -> int:
        """Compute capability x 10 of the code that runs on the GPU (the cubin's or the PTX's arch)."""
        return self._launcher.device_info(device_index).code_arch


@functools.lru_cache(maxsize=None)
def nvrtc_kernels() -> NvrtcKernels:
    """The NVRTC CUDA backend of this process.

    Raises:
        NvrtcUnavailable: no NVRTC / headers / kernel sources (the message says what to install).
    """
    return NvrtcKernels(KernelLauncher(toolchain=nvrtc.find_toolchain()))


def kernels_cached(device_index: int, folder=None) -> Optional[bool]:
    """Whether every kernel of the table is in the cache for the GPU's arch (None without a toolchain)."""
    import torch

    from vmamba2d.ops.compiled import kernel_cache
    from vmamba2d.ops.compiled.cuda_kernels import KERNELS

    try:
        toolchain = nvrtc.find_toolchain()
    except nvrtc.NvrtcUnavailable:
        return None
    major, minor = torch.cuda.get_device_capability(device_index)
    arch = major * 10 + minor
    try:
        return all(kernel_cache.lookup(spec, arch, folder, toolchain)[0] is not None for spec in KERNELS.values())
    except ValueError:
        return False
