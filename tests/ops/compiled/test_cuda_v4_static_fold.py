"""Static budgets of the four-route kernel folding the step sizes (dev/gpu/v4_static_report.py,
run_cross_fold): compiled for sm_90 with nvcc (no GPU), the model widths' folding instances keep the
launch bounds' registers, no spills, stack or block barrier, and the fold rule's figures
(rows_plan.CROSS_FOLD_SASS) are the compiler's. Skipped without nvcc."""
from __future__ import annotations

import pytest
from support.script_loading import load_script

report = load_script("dev/gpu/v4_static_report.py", "vmamba2d_v4_static_report")
NVCC, DISASSEMBLER = report.find_tools(None)
needs_nvcc = pytest.mark.skipif(NVCC is None or DISASSEMBLER is None, reason="nvcc / nvdisasm not found")


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_folding_kernel_holds_its_budgets_and_the_rules_figures(dtype):
    widths = list(report.WIDTHS)
    plain = report.run_cross(NVCC, DISASSEMBLER, ["sm_90"], [dtype], widths, prefetch=1)  # the fold's depth
    rows = report.run_cross_fold(NVCC, DISASSEMBLER, ["sm_90"], [dtype], widths)
    assert report.cross_fold_budget_failures(rows, plain) == []
    for r, base in zip(rows, plain):
        cells = [r.fold_cells[k] for k in report.fold_ranks(r.width)]
        # folding only adds work, more with every rank (two ranks a trip of the projection loop)
        assert base.per_cell_channel < cells[0] < cells[1] < cells[2] < cells[3], (r.label, cells)


def _row(**changes):
    row = report.Row("sm_90", "fp32", 56, 2, 1, 1, registers=64, spill_bytes=0, stack_bytes=0, barriers=0,
                     loop_instructions=300.0, per_cell_channel=235.4, resident_warps=32, in_flight_kib=24.0,
                     fold_cells={1: 235.4, 2: 277.7, 6: 362.3, 8: 404.6})
    return report.Row(**{**row.__dict__, **changes})


def test_fold_budgets_catch_what_they_hold():
    plain = [_row(per_cell_channel=187.4, fold_cells={})]
    assert report.cross_fold_budget_failures([_row()], plain) == []
    failures = report.cross_fold_budget_failures([_row(registers=72, spill_bytes=8, stack_bytes=8, barriers=1)],
                                                 plain)
    assert len(failures) == 3 and "72 registers > 64" in failures[0]
    # the rule's figures must be the compiled ones (within 3%)
    failures = report.cross_fold_budget_failures([_row(fold_cells={1: 260.0, 2: 302.3})], plain)
    assert failures == ["folding four-route sm_90 fp32 W=56: the fold rule's folded at R = 1 figure 235.4 is not "
                        "the compiled 260.0"]
    assert report.cross_fold_budget_failures([_row(fold_cells={})], plain) == [
        "folding four-route sm_90 fp32 W=56: no streaming loop found"]
    # the unfolded figure is the one-row-ahead kernel's (the folding instance's depth): a deeper ring's
    # row does not stand in for it
    assert report.cross_fold_budget_failures([_row()], [_row(prefetch=2, per_cell_channel=187.4, fold_cells={})]) == [
        "folding four-route sm_90 fp32 W=56: the fold rule's unfolded figure 187.4 is not the compiled None"]
    # other archs: resources only
    assert report.cross_fold_budget_failures([_row(arch="sm_80", fold_cells={1: 999.0, 2: 1999.0})], plain) == []


def test_fold_table_names_the_rule_limit():
    table = report.format_fold_table([_row()], [_row(per_cell_channel=187.4, fold_cells={})])
    line = table.splitlines()[-1]
    assert line == "| sm_90 | fp32 | 56 | 2 | 64 | 0 / 0 | 0 | 187.4 | 235.4 | 277.7 | 6: 362, 8: 405 | 3 |"
