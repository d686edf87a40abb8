// The GPU side of the v4 one-plane-per-lane forward (scan2d_planes.cuh): the CTA's execution
// context and the kernel template. Compiles with nvcc and with NVRTC (the element traits and the
// vector words are RS's, scan2d_rows_device.cuh).
#pragma once

#include "scan2d_planes.cuh"
#include "scan2d_rows_device.cuh"

namespace vmamba2d {
namespace planes {

using rows::DeviceBF16;
using rows::DeviceF16;
using rows::DeviceF32;
using rows::Word;

// The kernel's global views: raw pointers.
template <class Raw>
struct DeviceViews {
  const Raw* u;
  const Raw* delta;
  const Raw* B;
  const Raw* C;
  const float* A;
  const float* bias;
  const float* skip;
  Raw* y_t;
  float* y_f;
};

struct PlanesDeviceCtx {
  unsigned char* smem;

  SS2D_HD static constexpr int bug() { return kBugNone; }

  template <class F>
  __device__ SS2D_INLINE void each_thread(F&& f) const {
    f(static_cast<int>(threadIdx.x));
  }
  __device__ SS2D_INLINE void barrier() const { __syncthreads(); }

  template <class V>
  __device__ SS2D_INLINE V read(const V* ptr, int i) const {
    return ptr[i];
  }

  // kBytes bytes from src + at (elements; kBytes-aligned) into shared byte dst; bytes < kBytes reads
  // only that many (cp.async zero-fills the rest; the plain path leaves it).
  template <int kBytes, class V>
  __device__ SS2D_INLINE void copy_async(int dst, const V* src, long long at, int bytes) const {
    const V* from = src + at;
#if __CUDA_ARCH__ >= 800
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(smem + dst));
    if constexpr (kBytes == 16) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from), "r"(bytes) : "memory");
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(to), "l"(from), "n"(kBytes), "r"(bytes)
                   : "memory");
    }
#else
    using T = typename Word<kBytes>::type;
    if (bytes == kBytes) {
      *reinterpret_cast<T*>(smem + dst) = *reinterpret_cast<const T*>(from);
    } else {
      for (int b = 0; b < bytes; b += 2) {
        *reinterpret_cast<unsigned short*>(smem + dst + b) =
            *reinterpret_cast<const unsigned short*>(reinterpret_cast<const char*>(from) + b);
      }
    }
#endif
  }
  __device__ SS2D_INLINE void commit() const {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
  }
  __device__ SS2D_INLINE void wait_all() const {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
  }

  template <class T>
  __device__ SS2D_INLINE T lds(int at) const {
    return *reinterpret_cast<const T*>(smem + at);
  }
  template <class T>
  __device__ SS2D_INLINE void sts(int at, T v) const {
    *reinterpret_cast<T*>(smem + at) = v;
  }

  // kBytes bytes of shared memory at byte `from` to y + at (elements), as one global store.
  template <int kBytes, class V>
  __device__ SS2D_INLINE void shared_to_global(V* y, long long at, int from) const {
    const char* to = reinterpret_cast<const char*>(y + at);
    if constexpr (kBytes == 16) {
      const uint4 w = *reinterpret_cast<const uint4*>(smem + from);
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(to), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                   : "memory");
    } else if constexpr (kBytes == 8) {
      const uint2 w = *reinterpret_cast<const uint2*>(smem + from);
      asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(to), "r"(w.x), "r"(w.y) : "memory");
    } else if constexpr (kBytes == 4) {
      const unsigned w = *reinterpret_cast<const unsigned*>(smem + from);
      asm volatile("st.global.b32 [%0], %1;" ::"l"(to), "r"(w) : "memory");
    } else {
      const unsigned short w = *reinterpret_cast<const unsigned short*>(smem + from);
      asm volatile("st.global.b16 [%0], %1;" ::"l"(to), "h"(w) : "memory");
    }
  }
};

// Threads per CTA of the PL entry (one plane each: the chunk) and the CTAs per SM its registers are
// capped for (8 x 128 threads: 64 registers; shared memory admits fewer, see planes_layout).
constexpr int kPlanesThreads = 128;
constexpr int kPlanesMinBlocks = 8;

// The kernel body: CTA blockIdx.x of gridDim.x, blockDim.x == p.chunk threads, planes_layout(p).total
// bytes of dynamic shared memory.
template <class E, int kH, int kW, int kRoute, int kCopy>
__device__ SS2D_INLINE void planes_forward_kernel(const PlanesParams& p, unsigned char* smem) {
  if (p.height != kH || p.width != kW || p.route != kRoute || p.copy_bytes != kCopy ||
      p.chunk != static_cast<int>(blockDim.x)) {
    __trap();  // launched with a shape, route or staging the entry was not compiled for
  }
  using Raw = typename E::Raw;
  const DeviceViews<Raw> v{static_cast<const Raw*>(p.u), static_cast<const Raw*>(p.delta),
                           static_cast<const Raw*>(p.B), static_cast<const Raw*>(p.C), p.A, p.delta_bias, p.D,
                           static_cast<Raw*>(p.y), static_cast<float*>(p.y)};
  PlanesDeviceCtx ctx{smem};
  PlanesForward<E, kH, kW, kRoute, kCopy>::run(ctx, v, p, blockIdx.x, gridDim.x);
}

}  // namespace planes
}  // namespace vmamba2d
