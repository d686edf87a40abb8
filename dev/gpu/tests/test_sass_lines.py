"""dev/gpu/sass_lines.py: the executed-instruction estimate of dev/gpu/sass_report.py split by source
line and tile-loop phase, on a hand-written ``nvdisasm -c -gi`` listing with known loops, trip
counts and inline chains (no nvcc needed)."""
from __future__ import annotations

import pytest

from support.script_loading import load_script


sass_lines = load_script("dev/gpu/sass_lines.py", "sass_lines_under_test")

# Tile loop .L_x_1 .. 0x80 with two barriers (load phase up to the first, scan, store after the
# second) and a quad loop .L_x_2 .. 0x40 in the load phase; the load at 0x10 comes from a helper
# in h.cuh inlined at a.cu line 7 (chain innermost first), and so does 0x20, which has no comment.
LISTING = """\
.text.k:
\t//## File "/x/a.cu", line 5
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
\t//## File "/x/h.cuh", line 20 inlined at "/x/a.cu", line 7
\t//## File "/x/a.cu", line 7
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
.L_x_2:
        /*0020*/                   FADD R8, R5, R6 ;
\t//## File "/x/a.cu", line 8
        /*0030*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0040*/               @P1 BRA `(.L_x_2) ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
\t//## File "/x/a.cu", line 9
        /*0060*/                   FMUL R9, R8, R8 ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/              @!P0 BRA `(.L_x_1) ;
        /*0090*/                   EXIT ;
"""


def test_inline_chains_give_the_innermost_or_the_chosen_frame():
    chains = sass_lines.sass_report.inline_chains(LISTING)["k"]
    lines = {address: sass_lines.place(chain) for address, chain in chains.items()}
    assert lines == {0x00: "a.cu:5", 0x10: "h.cuh:20", 0x20: "h.cuh:20", 0x30: "a.cu:8", 0x40: "a.cu:8",
                     0x50: "a.cu:8", 0x60: "a.cu:9", 0x70: "a.cu:9", 0x80: "a.cu:9", 0x90: "a.cu:9"}
    outer = {address: sass_lines.place(chain, frame="a.cu") for address, chain in chains.items()}
    assert outer[0x10] == outer[0x20] == "a.cu:7" and outer[0x30] == "a.cu:8"


@pytest.mark.parametrize("threads, channels", [(128, 1), (128, 4), (96, 2)])
def test_line_costs_split_the_estimate_by_trips(threads, channels):
    instructions, labels = sass_lines.sass_report.parse_sass(LISTING)["k"]
    rows, estimate = sass_lines.attribute(instructions, labels, sass_lines.sass_report.inline_chains(LISTING)["k"],
                                          threads, channels)
    # Warp w runs the quad loop ceil((256 - 32 w) / threads) times; every other loop block once.
    warps = threads // 32
    quad_trips = sum(-(-(256 - 32 * w) // threads) for w in range(warps))
    unit = 32 / (1024 * channels)
    expected = {("h.cuh:20", "load"): (warps + quad_trips) * unit,  # 0x10 once, 0x20 per quad
                ("a.cu:8", "load"): (2 * quad_trips + warps) * unit,  # 0x30, 0x40 per quad; the BAR
                ("a.cu:9", "scan"): 2 * warps * unit,  # 0x60 and the second BAR
                ("a.cu:9", "store"): warps * unit}  # the back branch
    assert {(r.where, r.phase): r.per_cell_channel for r in rows} == pytest.approx(expected)
    assert sum(r.per_cell_channel for r in rows) == pytest.approx(estimate.per_cell_channel)
    assert [r.per_cell_channel for r in rows] == sorted((r.per_cell_channel for r in rows), reverse=True)
