"""CUDA build targets and resources, checked without a GPU.

* the default arch list and its intersection with what nvcc supports (vmamba2d/_cuda_archs.py);
* the per-device kernel-image check (``_extensions.cuda_kernel_usable``) against a stand-in
  extension module, and the real extension's entry point where it is built;
* the ptxas resource report of every kernel instantiation (tools/ptxas_report.py): zero spills,
  registers / shared memory / stack within the budgets stated in the tool (skipped without nvcc).
"""
from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from vmamba2d.ops import _extensions

REPO = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


archs = _load("vmamba2d_cuda_archs_under_test", REPO / "vmamba2d" / "_cuda_archs.py")


# --------------------------------------------------------------------------------------------
# default arch list


def test_default_archs_cover_volta_to_hopper_with_ptx():
    choice = archs.default_arch_choice(None)
    assert choice.arch_list == "7.0;7.5;8.0;8.6;9.0+PTX"
    assert choice.dropped == () and choice.reason == ""


def test_archs_that_nvcc_lacks_are_dropped_with_a_reason():
    nvcc13 = frozenset({"7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"})
    choice = archs.default_arch_choice(nvcc13, "nvcc 13.0")
    assert choice.arch_list == "7.5;8.0;8.6;9.0+PTX"
    assert choice.archs == ("7.5", "8.0", "8.6", "9.0")
    assert choice.dropped == ("7.0",) and "nvcc 13.0" in choice.reason


def test_ptx_moves_to_the_newest_kept_arch_when_its_own_arch_is_missing():
    old_nvcc = frozenset({"7.0", "7.5", "8.0", "8.6"})
    choice = archs.default_arch_choice(old_nvcc)
    assert choice.arch_list == "7.0;7.5;8.0;8.6+PTX" and choice.dropped == ("9.0",)


def test_no_supported_default_arch_is_an_error():
    with pytest.raises(RuntimeError, match="TORCH_CUDA_ARCH_LIST"):
        archs.default_arch_choice(frozenset({"12.0"}))


@pytest.mark.parametrize("name, arch", [("compute_70", "7.0"), ("sm_86", "8.6"), ("compute_90a", "9.0"),
                                        ("compute_100", "10.0"), ("compute_121", "12.1"), ("sm", None)])
def test_arch_names_parse(name, arch):
    assert archs.arch_from_compute_name(name) == arch


def test_arch_list_parsing_strips_ptx_and_duplicates():
    assert archs.parse_arch_list("8.0;9.0+PTX 9.0 Hopper,8.6") == ("8.0", "9.0", "8.6")
    assert archs.sm_name("8.6") == "sm_86" and archs.sm_name("9.0a") == "sm_90a"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_installed_nvcc_lists_its_archs():
    supported = archs.nvcc_supported_archs(shutil.which("nvcc"))
    assert supported and all(archs.parse_arch_list(a) == (a,) for a in supported)
    assert archs.nvcc_release(shutil.which("nvcc")) != "unknown"


# --------------------------------------------------------------------------------------------
# per-device kernel-image check, Python side


@pytest.fixture
def fake_cuda_extension(monkeypatch):
    """A stand-in _C_cuda whose kernel images cover the devices listed in ``images``."""
    calls: list[int] = []
    module = types.SimpleNamespace(images=set())

    def kernel_image_available(device_index: int) -> bool:
        calls.append(device_index)
        return device_index in module.images

    module.kernel_image_available = kernel_image_available
    module.calls = calls
    monkeypatch.setattr(_extensions, "cuda_extension", lambda: module)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"Tesla V100 #{index}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setitem(_extensions._failure_reasons, "vmamba2d._C_cuda", "")
    _extensions._cuda_kernel_usable_on.cache_clear()
    yield module
    _extensions._cuda_kernel_usable_on.cache_clear()


def test_device_with_a_kernel_image_is_usable_and_asked_once(fake_cuda_extension):
    fake_cuda_extension.images = {0}
    assert _extensions.cuda_kernel_usable(torch.device("cuda", 0))
    assert _extensions.cuda_kernel_usable(torch.device("cuda", 0))
    assert fake_cuda_extension.calls == [0]  # cached: no driver query per call


def test_device_without_a_kernel_image_is_refused_with_the_arch_to_build(fake_cuda_extension):
    fake_cuda_extension.images = {0}
    assert not _extensions.cuda_kernel_usable(torch.device("cuda"))  # index None: current device (1)
    assert fake_cuda_extension.calls == [1]
    reason = _extensions.failure_reason("cuda")
    assert "Tesla V100 #1" in reason and "sm_70" in reason and "TORCH_CUDA_ARCH_LIST" in reason


def test_missing_extension_is_not_usable(monkeypatch):
    monkeypatch.setattr(_extensions, "cuda_extension", lambda: None)
    _extensions._cuda_kernel_usable_on.cache_clear()
    try:
        assert not _extensions.cuda_kernel_usable(torch.device("cuda", 0))
    finally:
        _extensions._cuda_kernel_usable_on.cache_clear()


def _built_cuda_module():
    try:
        return importlib.import_module("vmamba2d._C_cuda")
    except ImportError:
        return None


@pytest.mark.skipif(_built_cuda_module() is None, reason="vmamba2d._C_cuda is not built")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_built_probe_without_a_gpu_raises_a_clear_error():
    with pytest.raises(RuntimeError, match="kernel_image_available: cudaGetDeviceCount failed"):
        _built_cuda_module().kernel_image_available(0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or _built_cuda_module() is None,
                    reason="needs a GPU and vmamba2d._C_cuda")
def test_built_probe_on_the_gpu():
    module = _built_cuda_module()
    assert module.kernel_image_available(0) is True, "built without this GPU's arch?"
    with pytest.raises(ValueError, match="device_index"):
        module.kernel_image_available(torch.cuda.device_count())
