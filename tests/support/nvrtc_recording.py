"""A recording stand-in for the CUDA driver and stub kernel images: the NVRTC launch tests run the launch glue without a GPU."""
from __future__ import annotations
from pathlib import Path
from vmamba2d.ops.compiled import kernel_cache, nvrtc
from vmamba2d.ops.compiled.cuda_kernels import KERNELS


ATTRIBUTES = {"MULTIPROCESSOR_COUNT": 132, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
              "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472, "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024}


class RecordingDriver:
    """cuda_launch.Driver's interface; records every call and reads the launch's parameters back
    from the pointer array it is given (while the launcher still holds the buffers)."""

    def __init__(self):
        self.calls = []

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
        self.calls.append(("launch", function, grid, threads, smem, stream, params))

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]


def stub_kernels(folder: Path, archs, toolchain: nvrtc.Toolchain) -> None:
    """Cache entries (keyed for ``toolchain``) for every table kernel and arch, with a recognisable fake image each, so the
    launcher finds them without compiling (the cache key is the real one)."""
    for spec in KERNELS.values():
        for arch in archs:
            target = nvrtc.target_for(arch, toolchain.archs)
            key = nvrtc.cache_key(toolchain, spec, target)
            image = f"image {spec.name} {target.kind} {target.arch}".encode()
            kernel = nvrtc.CompiledKernel(spec.name, arch, target, image, f"sym_{spec.file_stem}")
            kernel_cache.write_entry(kernel_cache.entry_path(folder, key), kernel_cache.encode_entry(key, kernel))
