// Runs scan2d_kernel.cuh on the CPU: every block of the grid in turn, and inside a block every
// (warp, lane) in turn between barriers. Shared memory and all scratch buffers start filled with
// NaN so a read of anything the kernel did not write first shows up in the results.
#include "scan2d_emulate.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <vector>

#include "scan2d_driver.h"
#include "scan2d_kernel.cuh"

namespace vmamba2d {
namespace scan2d {
namespace {

class HostCtx {
 public:
  static constexpr int kLaneSlots = kTile;

  explicit HostCtx(int nwarps) : nwarps_(nwarps) {}
  int nthreads() const { return nwarps_ * kTile; }
  int nwarps() const { return nwarps_; }
  int lane_slot(int lane) const { return lane; }

  template <class F>
  void each_thread(F&& f) const {
    for (int t = 0; t < nthreads(); ++t) f(t);
  }
  template <class F>
  void each_warp(F&& f) const {
    for (int w = 0; w < nwarps_; ++w) f(w);
  }
  template <class F>
  void each_lane(F&& f) const {
    for (int lane = 0; lane < kTile; ++lane) f(lane);
  }
  void barrier() const {}
  void sync_warp() const {}
  void add(float* target, float value, bool) const { *target += value; }

 private:
  int nwarps_;
};

std::vector<char> poisoned_shared(size_t bytes) {
  std::vector<char> smem(bytes);
  std::memset(smem.data(), 0xff, bytes);  // NaN floats, -1 integers
  return smem;
}

template <class Block>
void run_grid(int grid_x, int grid_y, int nwarps, size_t smem_bytes, Block&& block) {
  HostCtx ctx(nwarps);
  for (int by = 0; by < grid_y; ++by) {
    for (int bx = 0; bx < grid_x; ++bx) {
      std::vector<char> smem = poisoned_shared(smem_bytes);
      block(ctx, bx, by, smem.data());
    }
  }
}

struct HostBackend {
  static constexpr bool kCuda = false;

  static int backward_warps(int nstate) { return std::min(kMaxWarps, nstate); }

  static void forward(const Params& p, ElementType type, int nwarps, size_t smem_bytes) {
    run_grid(p.g.batch_blocks, p.g.dim, nwarps, smem_bytes,
             [&](HostCtx& ctx, int bx, int by, char* smem) {
               switch (type) {
                 case ElementType::kFloat32:
                   forward_block<float>(ctx, p, bx, by, smem);
                   break;
                 case ElementType::kFloat16:
                   forward_block<c10::Half>(ctx, p, bx, by, smem);
                   break;
                 case ElementType::kBFloat16:
                   forward_block<c10::BFloat16>(ctx, p, bx, by, smem);
                   break;
               }
             });
  }

  static void backward(const Params& p, ElementType type, int nwarps, size_t smem_bytes) {
    run_grid(p.g.batch_blocks, p.g.dim / p.channels_per_block, nwarps, smem_bytes,
             [&](HostCtx& ctx, int bx, int by, char* smem) {
               switch (type) {
                 case ElementType::kFloat32:
                   backward_block<float>(ctx, p, bx, by, smem);
                   break;
                 case ElementType::kFloat16:
                   backward_block<c10::Half>(ctx, p, bx, by, smem);
                   break;
                 case ElementType::kBFloat16:
                   backward_block<c10::BFloat16>(ctx, p, bx, by, smem);
                   break;
               }
             });
  }

  static void poison(at::Tensor& t) { t.fill_(std::numeric_limits<float>::quiet_NaN()); }
};

}  // namespace

at::Tensor emulate_forward(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                           const at::Tensor& B, const at::Tensor& C,
                           const std::optional<at::Tensor>& D,
                           const std::optional<at::Tensor>& delta_bias, bool delta_softplus,
                           int64_t height, int64_t width, bool out_fp32) {
  return forward_impl<HostBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height, width,
                                   out_fp32);
}

std::vector<at::Tensor> emulate_backward(const at::Tensor& u, const at::Tensor& delta,
                                         const at::Tensor& A, const at::Tensor& B,
                                         const at::Tensor& C, const std::optional<at::Tensor>& D,
                                         const std::optional<at::Tensor>& delta_bias,
                                         bool delta_softplus, int64_t height, int64_t width,
                                         const at::Tensor& dy, bool deterministic) {
  return backward_impl<HostBackend>(u, delta, A, B, C, D, delta_bias, delta_softplus, height,
                                    width, dy, deterministic);
}

}  // namespace scan2d
}  // namespace vmamba2d
