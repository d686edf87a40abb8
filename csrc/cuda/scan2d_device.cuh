// Execution context of scan2d_kernel.cuh on the GPU: each call runs the body for the calling
// thread only; global views are raw pointers, shared views 32-bit offsets into the block's dynamic
// shared memory (SharedWindowView). Methods are __host__ __device__ so the shared templates compile on both
// sides; their host branches are never executed.
#pragma once

#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "scan2d_common.h"
#include "scan2d_kernel.cuh"

namespace vmamba2d {
namespace scan2d {

template <>
struct Element<__half> {
  static __device__ SS2D_INLINE float load(__half v) { return __half2float(v); }
  static __device__ SS2D_INLINE __half store(float v) { return __float2half_rn(v); }
};

template <>
struct Element<__nv_bfloat16> {
  static __device__ SS2D_INLINE float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ SS2D_INLINE __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <size_t kBytes>
struct VectorWord;
template <>
struct VectorWord<4> {
  using type = uint4;
  static_assert(sizeof(type) == sizeof(Vec4<float>), "uint4 moves one fp32 quad");
};
template <>
struct VectorWord<2> {
  using type = uint2;
  static_assert(sizeof(type) == sizeof(Vec4<__half>), "uint2 moves one fp16 / bf16 quad");
};

// The block's dynamic shared memory (every extern __shared__ array of a kernel starts there).
extern __shared__ __align__(16) char scan2d_dynamic_smem[];

// A view of the block's dynamic shared memory: a 32-bit signed byte offset into it, each access
// scan2d_dynamic_smem + (offset + index * sizeof(V)) computed in 32 bits. Not a V* per view:
// NVRTC's front end keeps pointers into shared memory 64 bits wide (nvcc's 32 bits), so every view
// and index the block kept live as a pointer took two registers there, and the kernels at their
// __launch_bounds__ register caps spilled (sm_90). As offsets from the one symbol, the live values
// are 32 bits wide under both compilers (a view carrying the base pointer too put the backward's
// views into local memory on sm_75 under nvcc); signed, so the compiler may split a constant off an
// index (no wrap) and fold it into the access's immediate offset. Plain loads and stores: the
// compiler still merges, schedules and vectorises them (inline asm would pin every address in a
// register).
template <class V>
class SharedWindowView {
  static_assert(sizeof(V) == 4, "shared views hold 4-byte elements (as the host's)");

 public:
  SS2D_HD SS2D_INLINE explicit SharedWindowView(int offset) : offset_(offset) {}
  SS2D_HD SS2D_INLINE SharedWindowView operator+(int64_t k) const {
    return SharedWindowView(offset_ + static_cast<int>(k) * static_cast<int>(sizeof(V)));
  }
  SS2D_HD SS2D_INLINE V& operator[](int64_t i) const { return *reinterpret_cast<V*>(at(i)); }
  // Elements off .. off + 3 (16-byte aligned) as one 16-byte access.
  SS2D_HD SS2D_INLINE void load4(int64_t off, V (&out)[4]) const {
    const uint4 w = *reinterpret_cast<const uint4*>(at(off));
    memcpy(out, &w, sizeof(w));
  }
  SS2D_HD SS2D_INLINE void store4(int64_t off, const V (&in)[4]) const {
    uint4 w;
    memcpy(&w, in, sizeof(w));
    *reinterpret_cast<uint4*>(at(off)) = w;
  }

 private:
  SS2D_HD SS2D_INLINE char* at(int64_t i) const {
    return scan2d_dynamic_smem + (offset_ + static_cast<int>(i) * static_cast<int>(sizeof(V)));
  }
  int offset_;
};

struct DeviceCtx {
  static constexpr int kLaneSlots = 1;
  static constexpr int kThreadSlots = 1;

  // The block's shared memory is scan2d_dynamic_smem itself; smem (the kernel's extern array, the
  // same bytes) is the host context's.
  template <class V>
  SS2D_HD SS2D_INLINE SharedWindowView<V> shared(char*, size_t byte_offset, int64_t) const {
    return SharedWindowView<V>(static_cast<int>(byte_offset));
  }
  template <class V>
  SS2D_HD SS2D_INLINE V* global(V* ptr, int64_t) const {
    return ptr;
  }

  // The view of the elements from ptr + k on.
  template <class V>
  SS2D_HD SS2D_INLINE V* offset_view(V* ptr, int64_t k) const {
    return ptr + k;
  }

  // Vector accesses (Vec4): the caller checks vector_aligned first; ptr + off must be in bounds
  // for all kQuad elements (the host model checks both).
  template <class V>
  SS2D_HD SS2D_INLINE bool vector_aligned(const V* ptr, int64_t off) const {
    return (reinterpret_cast<uintptr_t>(ptr + off) & (sizeof(Vec4<V>) - 1)) == 0;
  }
  // A Vec4 struct copy can be split into scalar accesses by the compiler, so loads move a uint4
  // (4-byte elements) / uint2 (2-byte elements) and stores are written as one st.global.v4 / .v2.
  template <class V>
  SS2D_HD SS2D_INLINE Vec4<V> load_vector(const V* ptr, int64_t off) const {
    using Raw = typename VectorWord<sizeof(V)>::type;
    const Raw raw = *reinterpret_cast<const Raw*>(ptr + off);
    Vec4<V> v;
    memcpy(&v, &raw, sizeof(v));
    return v;
  }
  template <class V>
  SS2D_HD SS2D_INLINE void store_vector(V* ptr, int64_t off, const Vec4<V>& v) const {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(V) == 4) {
      uint32_t w[4];
      memcpy(w, &v, sizeof(w));
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr + off), "r"(w[0]), "r"(w[1]),
                   "r"(w[2]), "r"(w[3])
                   : "memory");
    } else {
      uint32_t w[2];
      memcpy(w, &v, sizeof(w));
      asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(ptr + off), "r"(w[0]), "r"(w[1]) : "memory");
    }
#endif
  }

  SS2D_HD SS2D_INLINE int nthreads() const {
#ifdef __CUDA_ARCH__
    return static_cast<int>(blockDim.x);
#else
    return 0;
#endif
  }
  SS2D_HD SS2D_INLINE int nwarps() const { return nthreads() / kTile; }
  SS2D_HD SS2D_INLINE int lane_slot(int) const { return 0; }
  SS2D_HD SS2D_INLINE int thread_slot(int) const { return 0; }

  template <class F>
  SS2D_HD SS2D_INLINE void each_thread(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x));
#endif
  }
  template <class F>
  SS2D_HD SS2D_INLINE void each_warp(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x) >> kTileShift);
#endif
  }
  template <class F>
  SS2D_HD SS2D_INLINE void each_lane(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x) & (kTile - 1));
#endif
  }
  SS2D_HD SS2D_INLINE void barrier() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  SS2D_HD SS2D_INLINE void sync_warp() const {
#ifdef __CUDA_ARCH__
    __syncwarp();
#endif
  }
};

}  // namespace scan2d
}  // namespace vmamba2d
