"""A recording stand-in for the CUDA driver and stub kernel images: the NVRTC launch tests run the launch glue without a GPU."""
from __future__ import annotations
import ctypes
from pathlib import Path
from vmamba2d.ops.compiled import cuda_launch, kernel_cache, nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KERNELS


ATTRIBUTES = {"MULTIPROCESSOR_COUNT": 132, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
              "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472, "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024}


class RecordingDriver:
    """cuda_launch.Driver's interface; records every call and reads the launch's parameters back
    from the pointer array it is given (while the launcher still holds the buffers)."""

    def __init__(self):
        self.calls = []
        self._param_types = ()
        self._params = []

    def read_params(self, *structs) -> list:
        """From now on each launch's parameters are read back as ``structs`` (ctypes types, in the
        kernel's parameter order), one list a launch, into the list returned."""
        self._param_types = structs
        self._params = []
        return self._params

    def device_attribute(self, device, name):
        self.calls.append(("attribute", device, name))
        return ATTRIBUTES[name]

    def load_module(self, image):
        self.calls.append(("load", image))
        return ("module", len([c for c in self.calls if c[0] == "load"]))

    def get_function(self, module, name):
        self.calls.append(("function", module, name))
        return ("function", module, name)

    def set_max_dynamic_smem(self, function, smem):
        self.calls.append(("smem", function, smem))

    def launch(self, function, grid, threads, smem, stream, params):
        assert isinstance(params, int) and isinstance(stream, int)
        assert all(isinstance(v, int) for v in (*grid, threads, smem))
        if self._param_types:
            array = (ctypes.c_void_p * len(self._param_types)).from_address(params)
            self._params.append([s.from_buffer_copy(ctypes.string_at(array[i], ctypes.sizeof(s)))
                                 for i, s in enumerate(self._param_types)])
        self.calls.append(("launch", function, grid, threads, smem, stream, params))

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


def recording_launcher(folder: Path, toolchain: nvrtc.Toolchain) -> tuple[cuda_launch.KernelLauncher, RecordingDriver]:
    """A launcher on a RecordingDriver with its kernel cache in ``folder``: device 0, an sm_90, whose
    current stream is 1000 + device."""
    driver = RecordingDriver()
    launcher = cuda_launch.KernelLauncher(driver, folder, toolchain, current_device=lambda: 0,
                                          stream_of=lambda d: 1000 + d, device_arch=lambda d: 90)
    return launcher, driver


def stub_kernel(folder: Path, spec, toolchain: nvrtc.Toolchain, arch: int = 90) -> None:
    """A cache entry (keyed for ``toolchain``) for ``spec`` on ``arch`` with a recognisable fake image
    and the symbol ``sym_<file stem>``, so the launcher finds it without compiling (the cache key is
    the real one)."""
    target = nvrtc.target_for(arch, toolchain.archs)
    key = nvrtc.cache_key(toolchain, spec, target)
    image = f"image {spec.name} {target.kind} {target.arch}".encode()
    kernel = nvrtc.CompiledKernel(spec.name, arch, target, image, f"sym_{spec.file_stem}")
    kernel_cache.write_entry(kernel_cache.entry_path(folder, key), kernel_cache.encode_entry(key, kernel))


def stub_kernels(folder: Path, archs, toolchain: nvrtc.Toolchain) -> None:
    """stub_kernel for every table kernel and arch."""
    for spec in KERNELS.values():
        for arch in archs:
            stub_kernel(folder, spec, toolchain, arch)
