"""The Triton row-streaming forward (vmamba2d.ops.triton.rows) and its plan rule.

``test_rows_kernel_in_the_interpreter`` runs tests/triton_interpreted_rows_cases.py in a fresh
Python with ``TRITON_INTERPRET=1`` set before triton is imported (the kernel against the fp64
reference on 7x7, 14x14, 5x9, 1x1 and 3x17 maps in fp32 / fp16 / bf16, the old and new forwards
against each other, the rule and its pin). The rule itself needs no Triton and is tested here too.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vmamba2d.ops import backend_info
from vmamba2d.ops.triton import rows_plan

HAS_TRITON = importlib.util.find_spec("triton") is not None
REPO_ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).resolve().parent / "triton_interpreted_rows_cases.py"


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
