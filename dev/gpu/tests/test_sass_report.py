"""The static report of the CUDA kernels (dev/gpu/sass_report.py): its pieces checked without a GPU
(the check of the real kernels against their targets is tests/ops/compiled/test_cuda_static_report.py, in CI).

* its pieces against hand-made inputs: the SASS parser, loop finder and load-batch count on a small
  listing, the occupancy model against values of CUDA's occupancy calculator;
* the executed-instruction estimate (control-flow graph, loops weighted by trip counts, scalar
  fallbacks left out) on hand-written listings with known loops and trip counts, and on a tiny
  kernel compiled with nvcc (skipped without it) against a count from the listing's addresses.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from support.script_loading import load_script


sass_report = load_script("dev/gpu/sass_report.py", "sass_report_under_test")

# A loop (head .L_x_1, conditional back edge at 0x80) holding a barrier and an inner loop
# (.L_x_2 .. 0x60); two loads, the second issued after the first one's use, so two batches; an
# unconditional backward jump from out-of-line code at 0xb0 that is not a loop.
LISTING = """\
.text._Z6kernelv:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   FADD R8, R5, R6 ;
        /*0030*/                   LDG.E R9, desc[UR4][R10.64] ;
.L_x_2:
        /*0040*/                   STS [R12], R9 ;
        /*0050*/                   IADD3 R12, R12, 0x4, RZ ;
        /*0060*/               @P1 BRA `(.L_x_2) ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/              @!P0 BRA `(.L_x_1) ;
        /*0090*/                   EXIT ;
.L_x_3:
        /*00a0*/                   NOP ;
        /*00b0*/                   BRA `(.L_x_1) ;
"""


def test_listing_is_parsed_into_instructions_and_labels():
    functions = sass_report.parse_sass(LISTING)
    instructions, labels = functions["_Z6kernelv"]
    assert len(instructions) == 12 and labels == {".L_x_1": 1, ".L_x_2": 4, ".L_x_3": 10}
    assert instructions[6].predicate == "@P1" and instructions[6].target == ".L_x_2"
    assert instructions[1].opcode == "LDG.E.128" and instructions[1].base == "LDG"


def test_tile_loop_is_the_innermost_loop_with_a_barrier():
    instructions, labels = sass_report.parse_sass(LISTING)["_Z6kernelv"]
    blocks = sass_report.basic_blocks(instructions, labels)
    loops = sorted(sorted(blocks[n].start for n in body) for body in sass_report.natural_loops(blocks))
    assert loops == [[1, 4, 7], [4]]  # blocks (first instructions); not the jump back at 0xb0
    loop = sass_report.tile_loop(instructions, labels)
    assert (loop.instructions, loop.inner_loops, loop.inner_loop_instructions) == (8, 1, 3)
    assert (loop.global_loads, loop.load_batches, loop.barriers, loop.shared_accesses) == (2, 2, 1, 1)
    assert loop.per_cell_channel_state == 8 / 32


def test_loop_bodies_entered_through_a_call_belong_to_the_tile_loop():
    # sm_80 style: the loop body (with the barrier) is reached only through CALL.REL.NOINC, whose
    # callee returns to the instruction after the call.
    listing = (
        ".text.g:\n"
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
        ".L_x_1:\n"
        "        /*0010*/                   LDG.E R4, desc[UR4][R2.64] ;\n"
        "        /*0020*/                   CALL.REL.NOINC `(.L_x_2) ;\n"
        "        /*0030*/                   BRA `(.L_x_3) ;\n"
        ".L_x_2:\n"
        "        /*0040*/                   FADD R5, R4, R4 ;\n"
        "        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
        "        /*0060*/               @P0 BRA `(.L_x_1) ;\n"
        "        /*0070*/                   RET.REL.NODEC R8 `(g) ;\n"
        ".L_x_3:\n"
        "        /*0080*/                   EXIT ;\n"
    )
    loop = sass_report.tile_loop(*sass_report.parse_sass(listing)["g"])
    assert loop is not None
    assert (loop.global_loads, loop.barriers, loop.load_batches) == (1, 1, 1)


def test_loads_issued_before_any_use_form_one_batch():
    body = sass_report.parse_sass(
        ".text.f:\n"
        "        /*0000*/                   LDG.E.64 R4, desc[UR4][R2.64] ;\n"
        "        /*0010*/                   LDG.E R6, desc[UR4][R2.64+0x100] ;\n"
        "        /*0020*/                   IMAD R8, R9, R9, RZ ;\n"  # no pending register read
        "        /*0030*/                   LDG.E R7, desc[UR4][R2.64+0x200] ;\n"
        "        /*0040*/                   FADD R10, R5, R7 ;\n"  # R5: upper half of the .64 load
        "        /*0050*/                   LDG.E R11, desc[UR4][R2.64+0x300] ;\n"
    )["f"][0]
    assert sass_report.load_batches(body) == (4, 2)
    assert sass_report.load_batches(body[:4]) == (3, 1)


# A tile loop (.L_x_1, with the barrier) holding a quad loop (.L_x_2) holding a channel loop
# (.L_x_3). The channel loop's body: a vector / scalar branch (0x50: one 128-bit load, 0x80: four
# 32-bit loads from tile.cuh line 12, the marked scalar fallback line), a block with a hot 32-bit
# load every path runs (0xc0, from pass.cuh), an optional block (0xf0).
# Per iteration, by hand: channel 1 (0x50) + 2 (vector) + 3 (0xc0..0xe0) + 2 (optional) + 2
# (0x110..0x120) = 10 on the interior path, 12 through the scalar side; quad 2 (0x30, 0x40) +
# channels x channel + 1 (0x130); tile 2 (0x10, 0x20) + quads x quad + 1 (0x140).
NESTED = """\
.text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/                   MOV R2, RZ ;
.L_x_2:
        /*0030*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0040*/                   MOV R3, RZ ;
.L_x_3:
        /*0050*/               @P1 BRA `(.L_x_4) ;
        /*0060*/                   LDG.E.128 R4, desc[UR4][R8.64] ;
        /*0070*/                   BRA `(.L_x_5) ;
.L_x_4:
	//## File "/x/tile.cuh", line 12
        /*0080*/                   LDG.E R4, desc[UR4][R8.64] ;
        /*0090*/                   LDG.E R5, desc[UR4][R8.64+0x4] ;
        /*00a0*/                   LDG.E R6, desc[UR4][R8.64+0x8] ;
        /*00b0*/                   LDG.E R7, desc[UR4][R8.64+0xc] ;
.L_x_5:
	//## File "/x/pass.cuh", line 40
        /*00c0*/                   LDG.E R11, desc[UR4][R12.64] ;
        /*00d0*/                   FADD R10, R4, R11 ;
        /*00e0*/               @P2 BRA `(.L_x_6) ;
        /*00f0*/                   MUFU.EX2 R10, R10 ;
        /*0100*/                   FADD R10, R10, 1 ;
.L_x_6:
        /*0110*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0120*/               @P3 BRA `(.L_x_3) ;
        /*0130*/               @P4 BRA `(.L_x_2) ;
        /*0140*/               @P5 BRA `(.L_x_1) ;
        /*0150*/                   EXIT ;
"""


MARKED = {("tile.cuh", 12)}


def _nested():
    instructions, labels = sass_report.parse_sass(NESTED)["k"]
    blocks = sass_report.basic_blocks(instructions, labels)
    loops = sorted(sass_report.natural_loops(blocks), key=len)  # channel, quad, tile
    return instructions, labels, blocks, loops


def _chains(listing: str = NESTED) -> dict:
    return sass_report.inline_chains(listing)["k"]


def _block_at(instructions, blocks, address: int) -> int:
    return next(n for n, b in enumerate(blocks) if instructions[b.start].address == address)


def test_scalar_fallbacks_are_the_blocks_of_marked_accesses():
    instructions, _, blocks, _ = _nested()
    # Not the 32-bit load at 0xc0: its line is not marked (every path runs it).
    assert sass_report.scalar_fallbacks(instructions, blocks, _chains(), MARKED) == {_block_at(instructions, blocks, 0x80)}
    assert sass_report.scalar_fallbacks(instructions, blocks, _chains(), set()) == set()


def test_a_fallback_merged_with_another_access_gives_no_estimate():
    # The compiler put the hot load of pass.cuh into the fallback's block: leaving that block out
    # would drop the hot load, so there is no estimate, and the report says why.
    merged = NESTED.replace("        /*00b0*/                   LDG.E R7, desc[UR4][R8.64+0xc] ;\n",
                            "        /*00b0*/                   LDG.E R7, desc[UR4][R8.64+0xc] ;\n"
                            '\t//## File "/x/pass.cuh", line 41\n'
                            "        /*00b8*/                   LDG.E R13, desc[UR4][R12.64] ;\n")
    assert merged != NESTED
    instructions, labels = sass_report.parse_sass(merged)["k"]
    with pytest.raises(sass_report.FallbackMismatch, match="0xb8"):
        sass_report.scalar_fallbacks(instructions, sass_report.basic_blocks(instructions, labels), _chains(merged),
                                     MARKED)
    estimate = sass_report.executed_estimate(instructions, labels, 128, 4, _chains(merged), MARKED)
    assert estimate.per_cell_channel is None and "merged" in estimate.note


def test_inline_chains_list_frames_innermost_first():
    listing = (".text.k:\n"
               '\t//## File "/x/h.cuh", line 20 inlined at "/x/a.cu", line 7\n'
               '\t//## File "/x/a.cu", line 7\n'
               "        /*0000*/                   LDG.E R4, desc[UR4][R2.64] ;\n"
               "        /*0010*/                   FADD R8, R5, R6 ;\n"
               '\t//## File "/x/a.cu", line 8\n'
               "        /*0020*/                   EXIT ;\n")
    assert sass_report.inline_chains(listing) == {"k": {0x00: (("h.cuh", 20), ("a.cu", 7)),
                                                        0x10: (("h.cuh", 20), ("a.cu", 7)),
                                                        0x20: (("a.cu", 8),)}}


def test_fallback_lines_are_the_marked_source_lines(tmp_path):
    (tmp_path / "k.cuh").write_text("int a;\nx = p[i];  // scalar fallback\n// scalar fallback, said here\n")
    (tmp_path / "notes.txt").write_text("y = q[i];  // scalar fallback\n")
    assert sass_report.fallback_lines(tmp_path) == {("k.cuh", 2)}
    # The kernels mark their per-cell accesses: load_cells / store_cells at least.
    assert {name for name, _ in sass_report.fallback_lines()} >= {"scan2d_tile.cuh"}


@pytest.mark.parametrize("quads, channels", [(1, 1), (2, 4), (3, 2), (0, 5)])
def test_loop_iterations_weight_inner_loops_by_their_trips(quads, channels):
    instructions, _, blocks, (channel, quad, tile) = _nested()
    inner = [(channel, channels), (quad, quads)]
    fallbacks = sass_report.scalar_fallbacks(instructions, blocks, _chains(), MARKED)
    interior = sass_report.iteration_instructions(instructions, blocks, tile, inner, fallbacks)
    assert interior == 2 + quads * (2 + channels * 10 + 1) + 1
    # Without the interior-quad assumption the longest path takes the scalar side.
    assert sass_report.iteration_instructions(instructions, blocks, tile, inner) == 2 + quads * (2 + channels * 12 + 1) + 1
    assert sass_report.iteration_instructions(instructions, blocks, channel, [], fallbacks) == 10


@pytest.mark.parametrize("threads, channels", [(128, 4), (96, 3), (64, 1)])
def test_executed_estimate_follows_the_launch_plan(threads, channels):
    instructions, labels, _, _ = _nested()
    estimate = sass_report.executed_estimate(instructions, labels, threads, channels, _chains(), MARKED)
    # Warp w runs ceil((256 - 32 w) / threads) quad trips: 2 each at 128 threads; 3, 3, 2 at 96.
    quad_trips = [-(-(256 - 32 * w) // threads) for w in range(threads // 32)]
    per_warp = [3 + q * (3 + channels * 10) for q in quad_trips]
    assert estimate.per_cell_channel == pytest.approx(sum(per_warp) * 32 / (1024 * channels))
    assert "interior quads" in estimate.note
    # The static figure counts each instruction once: 0x10 .. 0x140, 20 instructions / 32.
    assert sass_report.tile_loop(instructions, labels).per_cell_channel_state == 20 / 32
    with pytest.raises(ValueError, match="threads"):
        sass_report.executed_estimate(instructions, labels, 100, channels)


def test_no_estimate_where_a_subroutine_called_from_the_tile_loop_returns():
    listing = (
        ".text.g:\n"
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
        ".L_x_1:\n"
        "        /*0010*/                   CALL.REL.NOINC `(.L_x_2) ;\n"
        "        /*0020*/                   BRA `(.L_x_3) ;\n"
        ".L_x_2:\n"
        "        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
        "        /*0040*/               @P0 BRA `(.L_x_1) ;\n"
        "        /*0050*/                   RET.REL.NODEC R8 `(g) ;\n"
        ".L_x_3:\n"
        "        /*0060*/                   EXIT ;\n"
    )
    estimate = sass_report.executed_estimate(*sass_report.parse_sass(listing)["g"], 128, 4)
    assert estimate.per_cell_channel is None and "may return" in estimate.note


def test_a_predicated_call_with_no_return_is_a_loop_exit():
    # sm_80 style: the loop's exit test is a predicated CALL.REL.NOINC past the back branch, and no
    # RET follows: one trip runs 0x10 .. 0x30 (3 instructions), the exit block is outside the loop.
    listing = (
        ".text.g:\n"
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;\n"
        ".L_x_1:\n"
        "        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
        "        /*0020*/               @P0 CALL.REL.NOINC `(.L_x_2) ;\n"
        "        /*0030*/                   BRA `(.L_x_1) ;\n"
        ".L_x_2:\n"
        "        /*0040*/                   EXIT ;\n"
    )
    estimate = sass_report.executed_estimate(*sass_report.parse_sass(listing)["g"], 128, 4)
    assert estimate.per_cell_channel == pytest.approx(4 * 3 * 32 / (1024 * 4))


def test_kernel_names_give_dtype_and_variant():
    names = sass_report.ptxas_report.readable_names([
        "_ZN8vmamba2d6scan2d21scan2d_forward_kernelIfLNS0_7VariantE1EEEvNS0_6ParamsE",
        "_ZN8vmamba2d6scan2d22scan2d_backward_kernelI13__nv_bfloat16LNS0_7VariantE0EEEvNS0_6ParamsE",
    ])
    forward, backward = names.values()
    if "kOneStateSequential" in forward:  # a demangler was found (else the mangled names stay)
        assert forward == "void scan2d_forward_kernel<float, kOneStateSequential>"
        assert backward == "void scan2d_backward_kernel<__nv_bfloat16, kGeneral>"
    assert (sass_report._dtype_of(forward), sass_report._variant_of(forward)) in (
        ("fp32", "kOneStateSequential"), ("-", "-"))
    assert sass_report._dtype_of("void scan2d_forward_kernel<float>") == "fp32"
    assert sass_report._dtype_of("void scan2d_backward_kernel<__half, kGeneral>") == "fp16"


@pytest.mark.parametrize("nstate, wpc, tile_parallel, variant", [
    (1, 1, False, "kOneStateSequential"),
    (1, 1, True, "kGeneral"),    # the tile-parallel passes
    (2, 1, False, "kGeneral"),   # several states
    (16, 4, False, "kGeneral"),
])
def test_plan_variant_follows_the_kernels_choice(nstate, wpc, tile_parallel, variant):
    plan = {"fwd_warps_per_channel": wpc, "fwd_tile_parallel": tile_parallel}
    assert sass_report.plan_variant(plan, "fwd", nstate) == variant
    assert sass_report.plan_variant(dict(plan, fwd_variant="kGeneral"), "fwd", nstate) == "kGeneral"


# A kernel whose tile loop (with the barrier) holds one rolled loop of a run-time trip count.
TINY_KERNEL = r"""
extern "C" __global__ void tiny(float* out, const float* in, int tiles, int inner) {
  float acc = 0.f;
  for (int t = 0; t < tiles; ++t) {
    __syncthreads();
#pragma unroll 1
    for (int i = 0; i < inner; ++i) acc = acc * in[t * inner + i] + 1.f;
  }
  out[threadIdx.x] = acc;
}
"""

_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")


def _loop_spans(sass: str) -> list[int]:
    """Instructions from each label to the branch back to it, counted from the listing's addresses
    (16 bytes an instruction), smallest first."""
    labels, spans, last = {}, [], None
    for line in sass.splitlines():
        if match := re.match(r"\s*(\.L_x_\d+):", line):
            labels[match.group(1)] = None
        if match := _ADDRESS.search(line):
            last = int(match.group(1), 16)
            for label, at in labels.items():
                if at is None:
                    labels[label] = last
            if (target := re.search(r"BRA `\((\.L_x_\d+)\)", line)) and labels.get(target.group(1), last + 1) < last:
                spans.append((last - labels[target.group(1)]) // 16 + 1)
    return sorted(spans)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
@pytest.mark.skipif(sass_report.find_disassembler(shutil.which("nvcc") or "nvcc") is None, reason="no nvdisasm")
def test_executed_estimate_of_a_compiled_loop_matches_a_hand_count(tmp_path):
    source = tmp_path / "tiny.cu"
    source.write_text(TINY_KERNEL)
    nvcc = shutil.which("nvcc")
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-o", str(tmp_path / "tiny.cubin"), str(source)],
                   check=True, capture_output=True, timeout=120)
    sass = subprocess.run([sass_report.find_disassembler(nvcc), "-c", str(tmp_path / "tiny.cubin")],
                          check=True, capture_output=True, text=True).stdout
    inner, outer = _loop_spans(sass)  # the rolled loop, the tile loop (its body, the rolled loop included)
    instructions, labels = sass_report.parse_sass(sass)["tiny"]
    blocks = sass_report.basic_blocks(instructions, labels)
    loops = sorted(sass_report.natural_loops(blocks), key=len)
    assert [sum(blocks[n].end - blocks[n].start for n in body) for body in loops] == [inner, outer]
    for trips in (0, 1, 7):
        # One tile: the tile loop's own instructions once, the rolled loop's trips times.
        assert sass_report.iteration_instructions(instructions, blocks, loops[1], [(loops[0], trips)]) == \
            outer - inner + trips * inner
    # As the loop directly in the tile loop it is taken for a quad loop: 2 trips per warp at 128 threads.
    estimate = sass_report.executed_estimate(instructions, labels, 128, 1)
    assert estimate.per_cell_channel == pytest.approx(4 * (outer - inner + 2 * inner) * 32 / 1024)


# Expected values from CUDA's occupancy calculator (registers per warp rounded up to 256, shared
# memory per block plus the runtime's 1 KiB on sm_80+, rounded to the allocation unit).
@pytest.mark.parametrize("arch, registers, threads, smem, blocks", [
    ("9.0", 128, 128, 50 * 1024, 4),     # registers: 16 warps; shared memory: 4 x 51 KiB of 228
    ("9.0", 212, 128, 107 * 1024, 2),    # 216 registers/thread -> 9 warps: 2 blocks; smem: 2
    ("9.0", 80, 128, 33 * 1024, 6),      # 80 registers -> 25 warps -> 6 blocks; smem: 6 x 34 KiB
    ("8.0", 255, 128, 0, 2),             # 256 registers/thread: 8 warps
    ("8.6", 80, 128, 33 * 1024, 2),      # 100 KiB of shared memory per SM: 2 x 34 KiB
    ("8.6", 32, 256, 0, 6),              # 48 warps per SM
    ("8.6", 32, 32, 0, 16),              # 16 blocks per SM
    ("7.5", 32, 1024, 0, 1),             # 32 warps per SM on Turing
    ("7.5", 64, 128, 40 * 1024, 1),      # 64 KiB of shared memory per SM
    ("9.0", 32, 128, 228 * 1024, 0),     # more than a block may opt into
])
def test_resident_blocks_follow_the_occupancy_calculator(arch, registers, threads, smem, blocks):
    profile = sass_report.ARCH_PROFILES[arch]
    assert sass_report.resident_blocks(profile, registers, threads, smem) == blocks
