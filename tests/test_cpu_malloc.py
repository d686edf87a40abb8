"""vmamba2d.cpu_malloc: glibc keeps freed tensors' memory for reuse (page-fault counts)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmamba2d import cpu_malloc

REPO = Path(__file__).resolve().parents[1]
GLIBC = cpu_malloc._glibc() is not None

# Six steps of an MLP block's forward and backward at vmamba2d_tiny's stage-1 shape (batch 8: 38 MB
# hidden maps, above glibc's largest dynamic mmap threshold of 32 MiB); prints the fewest minor page
# faults of steps 3-6 and cpu_malloc_info() before and after the optional keep_freed_memory() call.
# The fewest, not the third step's: how many steps the heap takes to settle follows the allocation
# order of the CPU's kernels (here the third step faults nothing; CI's machine once faulted two
# hidden maps in it), while without the setting every step maps its hidden maps afresh. One thread:
# with several, glibc serves each thread from its own arena, and which arena a large block lands in
# then follows the threads' timing.
PROBE = """
import json, resource, sys
import torch
import torch.nn.functional as F
from vmamba2d import cpu_malloc
before = cpu_malloc.cpu_malloc_info()
kept = cpu_malloc.keep_freed_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(8, 96, 56, 56, requires_grad=True)
fc1, fc2 = torch.randn(384, 96, 1, 1, requires_grad=True), torch.randn(96, 384, 1, 1, requires_grad=True)
faults = []
for _ in range(6):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    F.conv2d(F.gelu(F.conv2d(x, fc1)), fc2).sum().backward()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
print(json.dumps({"before": before, "after": cpu_malloc.cpu_malloc_info(), "kept": kept, "faults": min(faults[2:]),
                  "faults_per_step": faults}))
"""
HIDDEN_MAP_PAGES = 8 * 384 * 56 * 56 * 4 // 4096


def _probe(mode: str, **extra_env: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != cpu_malloc.OPT_OUT_VARIABLE}
    env.update(extra_env)
    done = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _transparent_huge_pages_always() -> bool:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return setting.exists() and "[always]" in setting.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="the C library here is not glibc")
def test_a_training_step_reuses_freed_memory_without_page_faults():
    kept = _probe("keep")
    assert kept["kept"] is True
    assert kept["faults"] < HIDDEN_MAP_PAGES // 10, kept
    assert kept["before"] == {"allocator": "glibc", "keeps_freed_memory": False, "set_by": None}
    assert kept["after"] == {"allocator": "glibc", "keeps_freed_memory": True, "set_by": "keep_freed_memory()"}
    if not _transparent_huge_pages_always():  # huge pages would fault 512x less often by default
        default = _probe("default")
        assert default["faults"] > HIDDEN_MAP_PAGES, default  # each step maps its hidden maps afresh
        assert default["after"]["keeps_freed_memory"] is False


@pytest.mark.slow
@pytest.mark.skipif(not GLIBC, reason="the C library here is not glibc")
def test_the_opt_out_variable_makes_the_call_a_no_op():
    opted_out = _probe("keep", VMAMBA2D_KEEP_FREED_MEMORY="0")
    assert opted_out["kept"] is False and opted_out["after"]["keeps_freed_memory"] is False
    if not _transparent_huge_pages_always():
        assert opted_out["faults"] > HIDDEN_MAP_PAGES, opted_out


def test_a_bad_opt_out_value_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("VMAMBA2D_KEEP_FREED_MEMORY", "no")
    with pytest.raises(ValueError, match="VMAMBA2D_KEEP_FREED_MEMORY must be '0' or '1', got 'no'"):
        cpu_malloc.keep_freed_memory()


@pytest.mark.skipif(not GLIBC, reason="the C library here is not glibc")
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_opt_out_value_counts_as_unset(monkeypatch, value):
    monkeypatch.setenv("VMAMBA2D_KEEP_FREED_MEMORY", value)
    monkeypatch.setattr(cpu_malloc, "_kept_by_call", False)
    calls = []
    monkeypatch.setattr(cpu_malloc._glibc(), "mallopt", lambda parameter, value: calls.append((parameter, value)) or 1)
    assert cpu_malloc.keep_freed_memory() is True
    assert calls == [(cpu_malloc._M_MMAP_THRESHOLD, cpu_malloc.KEPT_BLOCK_BYTES),
                     (cpu_malloc._M_TRIM_THRESHOLD, cpu_malloc.KEPT_BLOCK_BYTES)]


@pytest.mark.skipif(not GLIBC, reason="the C library here is not glibc")
def test_the_environment_variables_are_reported_as_the_setting(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "2147483647")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "2147483647")
    monkeypatch.setattr(cpu_malloc, "_kept_by_call", False)
    assert cpu_malloc.cpu_malloc_info() == {"allocator": "glibc", "keeps_freed_memory": True,
                                            "set_by": "environment"}


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_malloc.platform, "system", lambda: "Darwin")
    monkeypatch.delenv("VMAMBA2D_KEEP_FREED_MEMORY", raising=False)
    cpu_malloc._glibc.cache_clear()
    try:
        assert cpu_malloc.keep_freed_memory() is False
        assert cpu_malloc.cpu_malloc_info() == {"allocator": "other", "keeps_freed_memory": False, "set_by": None}
    finally:
        cpu_malloc._glibc.cache_clear()


@pytest.mark.parametrize("value", [0, -1, 2**31, 1.5, True, "1"])
def test_a_bad_block_size_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match="block_bytes must be an int"):
        cpu_malloc.keep_freed_memory(value)
