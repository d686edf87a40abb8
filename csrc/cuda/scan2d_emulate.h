// Host emulation of the CUDA kernels (selective_scan_2d_emulate.cpp): the same block code run
// thread by thread on the CPU, in a chosen thread / warp / lane / block order, with a
// shared-memory race detector and bounds checks, for testing the kernel on machines without a GPU.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace vmamba2d {
namespace scan2d {

// How the emulation runs a launch.
//   order: 0 = every phase in forward thread / warp / lane / block order, 1 = reversed,
//          >= 2 = shuffled with `order` as the seed.
//   race_check: record every shared-memory access and fail on a data race.
//   drop_barrier: >= 0 skips the block barrier with that index (counted per block from 0), to
//          prove that the race detector notices a missing barrier; -1 keeps all.
//   sm_count, smem_per_sm: the device the plan is made for (the backward's channel slices and,
//          at N = 1, its channels per block depend on them); 164 KB per SM as on an A100.
struct EmulationOptions {
  int64_t order = 0;
  bool race_check = true;
  int64_t drop_barrier = -1;
  int64_t sm_count = 8;
  int64_t smem_per_sm = 164 * 1024;
  // Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin): 64 KiB on sm_75,
  // 99 KiB on sm_86 / sm_89, 163 KiB on sm_80, 227 KiB on sm_90.
  int64_t smem_per_block = 163 * 1024;
  // Compute capability x 10 of the code that runs (and of the device: 1 KiB of shared memory
  // reserved per block from 80 on): below 80 and 86 .. 89 run the forms the GPU build compiles for
  // those archs only (forward_block's kRegisterCarry).
  int64_t arch = 80;
};

std::vector<at::Tensor> emulate_forward(const at::Tensor& u, const at::Tensor& delta,
                                        const at::Tensor& A, const at::Tensor& B,
                                        const at::Tensor& C, const std::optional<at::Tensor>& D,
                                        const std::optional<at::Tensor>& delta_bias,
                                        bool delta_softplus, int64_t height, int64_t width,
                                        bool out_fp32, bool save_carries,
                                        const EmulationOptions& options);

std::vector<at::Tensor> emulate_backward(const at::Tensor& u, const at::Tensor& delta,
                                         const at::Tensor& A, const at::Tensor& B,
                                         const at::Tensor& C, const std::optional<at::Tensor>& D,
                                         const std::optional<at::Tensor>& delta_bias,
                                         bool delta_softplus, int64_t height, int64_t width,
                                         const at::Tensor& dy, const at::Tensor& carry_h,
                                         const at::Tensor& carry_v, const EmulationOptions& options);

// The four-route op (scan2d_routes.h) on the emulated kernel: cross_forward / cross_backward.
at::Tensor emulate_cross_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                 const at::Tensor& B, const at::Tensor& C, const std::optional<at::Tensor>& D,
                                 const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                 const std::vector<int64_t>& routes, bool out_fp32, const EmulationOptions& options);

std::vector<at::Tensor> emulate_cross_backward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                                               const at::Tensor& B, const at::Tensor& C,
                                               const std::optional<at::Tensor>& D,
                                               const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                                               const std::vector<int64_t>& routes, const at::Tensor& dy,
                                               const EmulationOptions& options);

// Runs one synthetic block that breaks (or keeps) one of the checker's rules; throws when the
// checker objects. Scenarios: ordered_by_barrier, ordered_by_syncwarp (pass) and
// read_after_write_across_warps, read_after_write_in_warp, write_after_read, write_after_write,
// uninitialised_read, out_of_bounds_shared, out_of_bounds_global, barrier_inside_warp_phase,
// syncwarp_inside_lane_phase, misaligned_shared_array, misaligned_vector_load,
// out_of_bounds_vector_load, misaligned_vector_store (throw); aligned_vector_access (passes).
void emulation_self_check(const std::string& scenario);

// Vector (Vec4) global loads and stores made by the last emulation call (emulate_forward,
// emulate_backward, emulate_cross_forward, emulate_cross_backward) on this thread.
int64_t emulation_vector_accesses();

// The variants (variant_name, in enum order) the forward blocks of the last emulation call ran on
// this thread.
std::vector<std::string> emulation_forward_variants();

// The kernels' softplus (scan2d_kernel.cuh) applied to every element of a float32 CPU tensor, as
// the host build computes it (tests of its error bound).
at::Tensor kernel_softplus(const at::Tensor& z);
// Its derivative sigmoid(z), from dt = softplus(z) >= 0, as the host build computes it.
at::Tensor kernel_softplus_grad_from_value(const at::Tensor& dt);
// sigmoid(z) from z and the kernels' softplus(z) (the N = 1 backward's), as the host build does.
at::Tensor kernel_sigmoid_from_softplus(const at::Tensor& z);

}  // namespace scan2d
}  // namespace vmamba2d
