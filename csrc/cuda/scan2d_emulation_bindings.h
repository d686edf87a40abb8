// Python bindings of the host emulation of the CUDA kernels (their code run on the CPU with the
// race detector) and of the launch planner, for tests and tools: shared by vmamba2d._C_cuda (nvcc
// build) and the test-only extension the C++ compiler builds alone
// (csrc/cuda/emulation/scan2d_v3_emulation_module.cpp, tests/support/cuda_emulation_build.py). Include in
// one translation unit per module.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include "scan2d_driver.h"
#include "scan2d_emulate.h"
#include "scan2d_routes.h"

namespace vmamba2d {
namespace scan2d {
namespace {

EmulationOptions emulation_options(int64_t order, bool race_check, int64_t drop_barrier,
                                   int64_t sm_count, int64_t smem_per_sm, int64_t smem_per_block,
                                   int64_t arch) {
  EmulationOptions o;
  o.order = order;
  o.race_check = race_check;
  o.drop_barrier = drop_barrier;
  o.sm_count = sm_count;
  o.smem_per_sm = smem_per_sm;
  o.smem_per_block = smem_per_block;
  o.arch = arch;
  return o;
}

std::vector<at::Tensor> emulate_forward_entry(
    const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
    const at::Tensor& C, const std::optional<at::Tensor>& D,
    const std::optional<at::Tensor>& delta_bias, bool delta_softplus, int64_t height,
    int64_t width, bool out_fp32, bool save_carries, int64_t order, bool race_check,
    int64_t drop_barrier, int64_t sm_count, int64_t smem_per_sm, int64_t smem_per_block, int64_t arch) {
  return emulate_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, out_fp32,
                         save_carries,
                         emulation_options(order, race_check, drop_barrier, sm_count, smem_per_sm,
                                           smem_per_block, arch));
}

std::vector<at::Tensor> emulate_backward_entry(
    const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B,
    const at::Tensor& C, const std::optional<at::Tensor>& D,
    const std::optional<at::Tensor>& delta_bias, bool delta_softplus, int64_t height,
    int64_t width, const at::Tensor& dy, const at::Tensor& carry_h, const at::Tensor& carry_v,
    int64_t order, bool race_check, int64_t drop_barrier, int64_t sm_count, int64_t smem_per_sm,
    int64_t smem_per_block, int64_t arch) {
  return emulate_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width, dy,
                          carry_h, carry_v,
                          emulation_options(order, race_check, drop_barrier, sm_count, smem_per_sm,
                                           smem_per_block, arch));
}

at::Tensor emulate_cross_forward_entry(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                       const at::Tensor& B, const at::Tensor& C,
                                       const std::optional<at::Tensor>& D,
                                       const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                       const std::vector<int64_t>& routes, bool out_fp32, int64_t order,
                                       bool race_check, int64_t drop_barrier, int64_t sm_count,
                                       int64_t smem_per_sm, int64_t smem_per_block, int64_t arch) {
  return emulate_cross_forward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, out_fp32,
                               emulation_options(order, race_check, drop_barrier, sm_count, smem_per_sm,
                                                 smem_per_block, arch));
}

std::vector<at::Tensor> emulate_cross_backward_entry(
    const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
    const std::optional<at::Tensor>& D, const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
    const std::vector<int64_t>& routes, const at::Tensor& dy, int64_t order, bool race_check, int64_t drop_barrier,
    int64_t sm_count, int64_t smem_per_sm, int64_t smem_per_block, int64_t arch) {
  return emulate_cross_backward(u, delta, A, B, C, D, delta_bias, delta_softplus, routes, dy,
                                emulation_options(order, race_check, drop_barrier, sm_count, smem_per_sm,
                                                  smem_per_block, arch));
}

// The work split plan_launch makes for these shapes on a device with these limits.
pybind11::dict launch_plan(int64_t batch, int64_t dim, int64_t groups, int64_t nstate,
                           int64_t height, int64_t width, int64_t sm_count, int64_t smem_per_sm,
                           int64_t smem_per_block, int64_t route, int64_t arch) {
  TORCH_CHECK_VALUE(batch >= 1 && dim >= 1 && groups >= 1 && dim % groups == 0,
                    "launch_plan: need batch, dim >= 1 and groups dividing dim, got batch=", batch,
                    " dim=", dim, " groups=", groups);
  TORCH_CHECK_VALUE(nstate >= 1 && nstate <= kMaxState, "launch_plan: N must be in 1..", kMaxState,
                    ", got ", nstate);
  TORCH_CHECK_VALUE(height >= 1 && width >= 1, "launch_plan: height and width must be >= 1, got ",
                    height, " x ", width);
  TORCH_CHECK_VALUE(sm_count >= 1 && smem_per_block >= 1 && smem_per_sm >= smem_per_block,
                    "launch_plan: need sm_count >= 1 and smem_per_sm >= smem_per_block >= 1");
  TORCH_CHECK_VALUE(route >= -1 && route < 16 && (route < 0 || groups == 1),
                    "launch_plan: route must be -1 (the single-route op) or a route code in [0, 16) with groups = 1, "
                    "got route=", route, " groups=", groups);
  Geometry g = plan_geometry(batch, dim, groups, nstate, height, width);
  if (route >= 0) {  // the four-route op's launch of that route on an H x W map
    const CrossShape s{batch, dim, 1, nstate, height, width};
    const auto [rows, cols] = route_grid(s, route);
    g = plan_geometry(batch, dim, 1, nstate, rows, cols);
    g.route = route_addressing(s, route, false);
  }
  TORCH_CHECK_VALUE(arch >= 10, "launch_plan: arch must be a compute capability x 10 (e.g. 86), got ", arch);
  const DeviceLimits dev{static_cast<int>(sm_count), static_cast<size_t>(smem_per_block),
                         static_cast<size_t>(smem_per_sm), static_cast<int>(arch),
                         reserved_smem_per_block(static_cast<int>(arch))};
  const Launch k = plan_launch(g, dev);
  pybind11::dict d;
  d["tiles"] = pybind11::make_tuple(g.tiles_h, g.tiles_w);
  d["maps_per_tile"] = pybind11::make_tuple(g.pack_rows, g.pack_cols);
  auto add_pass = [&](const std::string& pass, int channels, int wpc, size_t smem, int registers,
                      int64_t blocks) {
    const int per_sm = resident_blocks(smem, channels * wpc, registers, dev);
    const WaveFit fit = wave_fit(blocks, static_cast<int64_t>(dev.sm_count) * per_sm);
    d[(pass + "_channels").c_str()] = channels;
    d[(pass + "_warps_per_channel").c_str()] = wpc;
    d[(pass + "_threads").c_str()] = channels * wpc * kTile;
    d[(pass + "_smem_bytes").c_str()] = smem;
    d[(pass + "_registers").c_str()] = registers;
    d[(pass + "_resident_blocks").c_str()] = per_sm;
    d[(pass + "_resident_warps").c_str()] = per_sm * channels * wpc;
    d[(pass + "_blocks").c_str()] = blocks;
    d[(pass + "_waves").c_str()] = fit.waves;
    d[(pass + "_lost_slots").c_str()] = fit.lost;
  };
  // The kernel variant that runs each pass's main grid.
  auto variant_of = [&](bool tile_parallel, int wpc) {
    Params p{};
    p.g = g;
    p.pass = tile_parallel ? kFinal : kSequential;
    return kernel_variant(p, wpc);
  };
  const Variant fwd_variant = variant_of(k.tile_parallel, k.fwd_wpc);
  const Variant bwd_variant = variant_of(k.bwd_tile_parallel, k.bwd_wpc);
  add_pass("fwd", k.fwd_channels, k.fwd_wpc,
           forward_layout(k.fwd_channels, k.fwd_wpc, g.nstate, g.route.active, k.fwd_carry_in_registers).total,
           forward_registers(fwd_variant, dev.arch), forward_blocks(g, k));
  add_pass("bwd", k.bwd_channels, k.bwd_wpc,
           backward_layout(k.bwd_channels, k.bwd_wpc, g.nstate).total,
           backward_registers(bwd_variant), backward_blocks(g, k));
  d["fwd_tile_parallel"] = k.tile_parallel;
  d["bwd_slices"] = k.slices;
  d["bwd_tile_parallel"] = k.bwd_tile_parallel;
  d["fwd_variant"] = variant_name(fwd_variant);
  d["bwd_variant"] = variant_name(bwd_variant);
  return d;
}

}  // namespace

inline void define_emulation_bindings(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("_emulate_forward", &emulate_forward_entry,
        "The CUDA forward kernel's code run on the CPU (CPU tensors; for tests). Same arguments as\n"
        "forward plus: order (0 forward, 1 reversed, >= 2 shuffled thread / warp / lane / block\n"
        "order with that seed), race_check (shared-memory race detector), drop_barrier (index of a\n"
        "block barrier to leave out, -1 none), sm_count, smem_per_sm and smem_per_block (the device\n"
        "the work split is planned for: SMs, shared memory per SM and opt-in per block, in bytes)\n"
        "and arch (the compute capability x 10 of the code that runs: below 80 and 86 .. 89 the forward's\n"
        "register-carry form; 1 KiB of shared memory reserved per block from 80 on).",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("out_fp32"), py::arg("save_carries"), py::arg("order") = 0,
        py::arg("race_check") = true, py::arg("drop_barrier") = -1, py::arg("sm_count") = 8,
        py::arg("smem_per_sm") = 164 * 1024, py::arg("smem_per_block") = 163 * 1024,
        py::arg("arch") = 80);
  m.def("_emulate_backward", &emulate_backward_entry,
        "The CUDA backward kernel's code run on the CPU (CPU tensors; for tests). Same arguments as\n"
        "backward plus order, race_check, drop_barrier, sm_count, smem_per_sm, smem_per_block, arch\n"
        "(see _emulate_forward).",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("height"), py::arg("width"),
        py::arg("dy"), py::arg("carry_h"), py::arg("carry_v"), py::arg("order") = 0,
        py::arg("race_check") = true, py::arg("drop_barrier") = -1, py::arg("sm_count") = 8,
        py::arg("smem_per_sm") = 164 * 1024, py::arg("smem_per_block") = 163 * 1024,
        py::arg("arch") = 80);
  m.def("_emulate_cross_forward", &emulate_cross_forward_entry,
        "cross_forward's kernels run on the CPU (CPU tensors; for tests). Same arguments as\n"
        "cross_forward plus order, race_check, drop_barrier, sm_count, smem_per_sm, smem_per_block, arch\n"
        "(see _emulate_forward).",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("routes"), py::arg("out_fp32"),
        py::arg("order") = 0, py::arg("race_check") = true, py::arg("drop_barrier") = -1, py::arg("sm_count") = 8,
        py::arg("smem_per_sm") = 164 * 1024, py::arg("smem_per_block") = 163 * 1024,
        py::arg("arch") = 80);
  m.def("_emulate_cross_backward", &emulate_cross_backward_entry,
        "cross_backward's kernels run on the CPU (CPU tensors; for tests). Same arguments as\n"
        "cross_backward plus order, race_check, drop_barrier, sm_count, smem_per_sm, smem_per_block, arch\n"
        "(see _emulate_forward).",
        py::arg("u"), py::arg("delta"), py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"),
        py::arg("delta_bias"), py::arg("delta_softplus"), py::arg("routes"), py::arg("dy"),
        py::arg("order") = 0, py::arg("race_check") = true, py::arg("drop_barrier") = -1, py::arg("sm_count") = 8,
        py::arg("smem_per_sm") = 164 * 1024, py::arg("smem_per_block") = 163 * 1024,
        py::arg("arch") = 80);
  m.def("_emulation_self_check", &emulation_self_check,
        "Runs a synthetic block through the emulation's checker (tests of the race detector);\n"
        "raises RuntimeError when the checker objects. See scan2d_emulate.h for the scenarios.",
        py::arg("scenario"));
  m.def("_launch_plan", &launch_plan,
        "The kernels' work split for these shapes on a device with sm_count SMs and smem_per_sm /\n"
        "smem_per_block bytes of shared memory (per SM / opt-in per block): channels and warps per\n"
        "block, threads, dynamic shared memory, the registers per thread it is compiled for, the\n"
        "modelled resident blocks / warps per SM, the main grid's blocks, its waves over the device's\n"
        "resident block slots and the share of slots they leave empty, slices, tiling, and the\n"
        "kernel variant (fwd_variant / bwd_variant) that runs each pass. route >= 0: the four-route\n"
        "op's launch of that route code on an H x W map (groups = 1). arch: the device's compute\n"
        "capability x 10 (the _emulate_* default, 80; see _emulate_forward).",
        py::arg("batch"), py::arg("dim"), py::arg("groups"), py::arg("nstate"), py::arg("height"),
        py::arg("width"), py::arg("sm_count"), py::arg("smem_per_sm"), py::arg("smem_per_block"),
        py::arg("route") = -1, py::arg("arch") = 80);
  m.def("_softplus", &kernel_softplus,
        "The kernels' fast softplus on a float32 CPU tensor, as the host build computes it (tests).",
        py::arg("z"));
  m.def("_softplus_grad_from_value", &kernel_softplus_grad_from_value,
        "The kernels' sigmoid(z) from dt = softplus(z) on a float32 CPU tensor (host build; tests).",
        py::arg("dt"));
  m.def("_sigmoid_from_softplus", &kernel_sigmoid_from_softplus,
        "The N = 1 backward's sigmoid(z) = exp(z - softplus(z)) on a float32 CPU tensor (host build;\n"
        "tests).",
        py::arg("z"));
  m.def("_emulation_vector_accesses", &emulation_vector_accesses,
        "Vector (16-byte fp32 / 8-byte fp16, bf16) global loads and stores made by the last\n"
        "_emulate_forward / _emulate_backward call on this thread (tests of the vector path).");
  m.def("_emulation_forward_variants", &emulation_forward_variants,
        "The kernel variants (Variant names, in enum order) the forward blocks of the last emulation\n"
        "call on this thread ran (tests that a plan runs the variant _launch_plan reports).");
}

}  // namespace scan2d
}  // namespace vmamba2d
