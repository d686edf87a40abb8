"""The Triton row-streaming forward (vmamba2d.ops.triton.rows) and its plan rule.

``test_rows_kernel_in_the_interpreter`` runs tests/ops/triton/triton_interpreted_rows_cases.py in a fresh
Python with ``TRITON_INTERPRET=1`` set before triton is imported (the kernel against the fp64
reference on 7x7, 14x14, 5x9, 1x1 and 3x17 maps in fp32 / fp16 / bf16, the old and new forwards
against each other, the rule and its pin). The rule itself needs no Triton and is tested here too.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vmamba2d.ops import backend_info
from vmamba2d.ops.triton import rows_plan

HAS_TRITON = importlib.util.find_spec("triton") is not None
REPO_ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).resolve().parent / "triton_interpreted_rows_cases.py"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_rows_kernel_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    for name in ("VMAMBA2D_SCAN_BACKEND", rows_plan.PLAN_ENV_VAR):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider"],
                            env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and " passed" in summary and "skipped" not in summary, (
        result.stdout[-6000:] + result.stderr[-3000:])


def test_rule_without_triton(monkeypatch):
    monkeypatch.delenv(rows_plan.PLAN_ENV_VAR, raising=False)
    assert rows_plan.forward_design(1, 7, 7, torch.float16, False) == "rows"
    assert rows_plan.forward_design(1, 7, 7, torch.float16, True) == "tiles"
    monkeypatch.setenv(rows_plan.PLAN_ENV_VAR, "tiles")
    assert rows_plan.forward_design(1, 7, 7, torch.float16, False) == "tiles"


def test_backend_info_states_the_rule(monkeypatch):
    monkeypatch.setenv(rows_plan.PLAN_ENV_VAR, "tiles")
    info = backend_info()["triton_forward"]
    assert info["pin"] == "tiles" and "d_state 1" in info["rule"]


def _row_layout(ttgir: str) -> tuple:
    """(sizePerThread, threadsPerWarp, warpsPerCTA) along W of the layout the row scan runs in."""
    scan = re.search(r'"tt\.scan"\(.*?\) <\{axis = 1.*?\}> \(\{.*?\}\) : \(tensor<\d+x\d+xf32, #(\w+)>', ttgir, re.S)
    assert scan, "no tt.scan along axis 1 in the kernel"
    layout = re.search(rf"#{scan.group(1)} = #ttg\.blocked<\{{(.*?)\}}>", ttgir).group(1)
    fields = dict((name, int(along_w)) for name, _, along_w in re.findall(r"(\w+) = \[(\d+), (\d+)\]", layout))
    return fields["sizePerThread"], fields["threadsPerWarp"], fields["warpsPerCTA"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tuning_candidates_scan_a_row_in_one_layout(dtype, monkeypatch):
    """Compiled for sm_90 without a GPU: every autotune candidate lays a row over the same threads
    and warps, so the row scan combines in the same order and no output bit depends on the choice."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    previous = sys.modules.pop(rows_plan.ROWS_MODULE, None)
    try:
        static = importlib.import_module("vmamba2d.ops.triton.static")
        if not static._cuobjdump().exists():
            pytest.skip("triton's cuobjdump is missing")
        rows = importlib.import_module(rows_plan.ROWS_MODULE)
        pointers = {name: dtype for name in ("u_ptr", "delta_ptr", "B_ptr", "C_ptr", "y_ptr")}
        for width, route in ((7, 0), (14, 0), (16, 5), (56, 0)):
            block_w = rows_plan.block_width(width)
            layouts = set()
            for block_m, warps in rows_plan.tuning_configs(block_w):
                compiled = static.compile_for(
                    rows.rows_fwd_kernel, dict(chans=96, param_groups=2, height=width, width=width),
                    dict(HAS_D=True, HAS_BIAS=True, SOFTPLUS=True, ROUTE=route, BLOCK_M=block_m, BLOCK_W=block_w),
                    dtype, pointers, 90, warps)
                assert compiled.spill_store_bytes == 0, (width, block_m, warps)
                layouts.add(_row_layout(compiled.asm["ttgir"]))
            assert len(layouts) == 1, (width, layouts)
    finally:
        sys.modules.pop(rows_plan.ROWS_MODULE, None)
        if previous is not None:
            sys.modules[rows_plan.ROWS_MODULE] = previous
