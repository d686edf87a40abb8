"""Static budgets of the v4 one-plane-per-lane forward (dev/gpu/v4_static_planes.py): compiled for sm_90
with nvcc (no GPU), the model's 7 x 7 instances keep <= 64 registers, no spills or stack, two block
barriers per chunk loop and their chunk loop within the SASS-per-cell·channel ratchet (skipped without
nvcc); the plan's shared memory, residency, bytes in flight and the layout's bank conflicts."""
from __future__ import annotations

import pytest
from support.script_loading import load_script

report = load_script("dev/gpu/v4_static_planes.py", "vmamba2d_v4_static_planes")
NVCC, DISASSEMBLER = report.find_tools(None)
needs_nvcc = pytest.mark.skipif(NVCC is None or DISASSEMBLER is None, reason="nvcc / nvdisasm not found")


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_model_plane_holds_the_budgets(dtype):
    (row,) = report.run(NVCC, DISASSEMBLER, ["sm_90"], [dtype], [(7, 7)])
    assert row.per_cell_channel is not None and row.per_cell_channel > 20
    assert report.budget_failures([row]) == []


def test_plan_figures_of_the_model_plane():
    # bf16 7 x 7 on an H100 / H200: 128 maps a chunk, 2 x 25,632 B of buffers, 4 CTAs (16 warps) an SM,
    # one buffer of each in flight: 100 KiB; fp32 twice the bytes, 2 CTAs.
    bf16 = report.plan_for("sm_90", "bf16", 7, 7)
    assert (bf16.chunk, bf16.smem, bf16.ctas_per_sm) == (128, 51264, 4)
    fp32 = report.plan_for("sm_90", "fp32", 7, 7)
    assert (fp32.chunk, fp32.ctas_per_sm) == (128, 2)
    assert report.plan_for("sm_75", "fp32", 7, 7).chunk == 64  # 64 KiB per CTA


def test_bank_conflicts_of_the_layout():
    # Odd planes (49 words) put the 32 lanes' loads in 32 banks; 2-byte planes of 49 cells pair some
    # lanes on a bank; 64-cell planes (64 / 32 words: every lane on one bank if packed) take a 16-byte
    # pad each: 4 words a bank.
    assert report.bank_conflict_ways(49, 4) == 1
    assert report.bank_conflict_ways(49, 2) == 2
    assert report.bank_conflict_ways(64, 4) == 4 and report.planes_launch.plane_pitch(64, 4, 16) == 272
    assert report.bank_conflict_ways(64, 2) == 4 and report.planes_launch.plane_pitch(64, 2, 16) == 144
    assert report.bank_conflict_ways(15, 4) == 1 and report.planes_launch.plane_pitch(49, 4, 4) == 196


def test_budgets_catch_what_they_hold():
    row = report.Row("sm_90", "fp32", 7, 7, 128, registers=72, spill_bytes=8, stack_bytes=8, barriers=6,
                     per_cell_channel=99.0, smem_kib=99.8, resident_warps=8, in_flight_kib=100.0, bank_ways=1)
    failures = report.budget_failures([row])
    assert len(failures) == 4
    assert any("72 registers" in f for f in failures) and any("6 block barriers" in f for f in failures)
    assert any("spills" in f for f in failures) and any("99.0 SASS" in f for f in failures)
