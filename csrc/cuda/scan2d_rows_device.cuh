// The GPU side of the v4 row-streaming forward (scan2d_rows.cuh): the element traits of the CUDA
// types, the warp's execution context and the kernel template. Compiles with nvcc and with NVRTC
// (cuda_fp16.h / cuda_bf16.h are NVRTC-ready; no standard library, no torch).
#pragma once

#ifndef __CUDACC_RTC__
#include <string.h>  // memcpy (a built-in under NVRTC)
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "scan2d_rows.cuh"

namespace vmamba2d {
namespace rows {

// Element traits: to_float / from_float one element (round to nearest even), widen kN elements.
struct DeviceF32 {
  using Raw = float;
  static __device__ SS2D_INLINE float to_float(float v) { return v; }
  static __device__ SS2D_INLINE float from_float(float v) { return v; }
  template <int kN>
  static __device__ SS2D_INLINE void widen(const float (&in)[kN], float (&out)[kN]) {
SS2D_UNROLL
    for (int k = 0; k < kN; ++k) out[k] = in[k];
  }
};

struct DeviceF16 {
  using Raw = unsigned short;
  static __device__ SS2D_INLINE float to_float(unsigned short v) { return __half2float(__ushort_as_half(v)); }
  static __device__ SS2D_INLINE unsigned short from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
  template <int kN>
  static __device__ SS2D_INLINE void widen(const unsigned short (&in)[kN], float (&out)[kN]) {
SS2D_UNROLL
    for (int k = 0; k < kN; ++k) out[k] = to_float(in[k]);
  }
};

struct DeviceBF16 {
  using Raw = unsigned short;
  // bf16 is the upper half of an fp32: widening is a shift.
  static __device__ SS2D_INLINE float to_float(unsigned short v) { return __uint_as_float(static_cast<unsigned>(v) << 16); }
  static __device__ SS2D_INLINE unsigned short from_float(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
  // kN elements in memory order, widened a 32-bit word (two elements) at a time: the low one by a
  // shift, the high one by a byte permute that clears the low half (one instruction each; a mask
  // would be rewritten into a shift pair).
  template <int kN>
  static __device__ SS2D_INLINE void widen(const unsigned short (&in)[kN], float (&out)[kN]) {
SS2D_UNROLL
    for (int k = 0; k + 1 < kN; k += 2) {
      const unsigned w = static_cast<unsigned>(in[k]) | (static_cast<unsigned>(in[k + 1]) << 16);
      out[k] = __uint_as_float(w << 16);
      out[k + 1] = __uint_as_float(__byte_perm(w, 0u, 0x3244));
    }
    if constexpr (kN % 2 != 0) out[kN - 1] = to_float(in[kN - 1]);
  }
};

// One global access of kBytes bytes as a single load / store instruction.
template <int kBytes>
struct Word;
template <>
struct Word<2> {
  using type = unsigned short;
};
template <>
struct Word<4> {
  using type = unsigned int;
};
template <>
struct Word<8> {
  using type = uint2;
};
template <>
struct Word<16> {
  using type = uint4;
};

struct RowsDeviceCtx {
  static constexpr int kLanes = 1;

  SS2D_HD SS2D_INLINE int slot(int) const { return 0; }

  template <class F>
  SS2D_HD SS2D_INLINE void each_lane(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x) & (kWarpLanes - 1));
#endif
  }

  template <class V>
  SS2D_HD SS2D_INLINE V* global(V* ptr, long long) const {
    return ptr;
  }
  template <class V>
  SS2D_HD SS2D_INLINE V read(const V* ptr, int i) const {
    return ptr[i];
  }
  // The view of the elements from ptr + at on (negative indices reach back before it).
  template <class V>
  SS2D_HD SS2D_INLINE V* offset(V* ptr, long long at) const {
    return ptr + at;
  }

  // A lane's view as a register of its own: the compiler may not fold it back into base + index
  // arithmetic (it would rebuild the 64-bit address from the index every row).
  template <class V>
  SS2D_HD SS2D_INLINE V* pin(V* ptr) const {
#ifdef __CUDA_ARCH__
    asm("" : "+l"(ptr));
#endif
    return ptr;
  }
  // The same for a row offset: each access then takes view + offset in one multiply-add, where the
  // compiler would otherwise step a pointer per tensor and shuffle the pointers between registers.
  SS2D_HD SS2D_INLINE int pin(int v) const {
#ifdef __CUDA_ARCH__
    asm("" : "+r"(v));
#endif
    return v;
  }

  // kCount consecutive elements from ptr + i, as 16-byte pieces (32 bytes: fp32 y of 8 bf16
  // columns) or one narrower access; the plan guarantees the alignment.
  template <int kCount, class V>
  SS2D_HD SS2D_INLINE void load(const V* ptr, int i, V* dst) const {
    constexpr int kBytes = kCount * static_cast<int>(sizeof(V));
    constexpr int kPiece = kBytes > 16 ? 16 : kBytes;
SS2D_UNROLL
    for (int b = 0; b < kBytes; b += kPiece) {
      using T = typename Word<kPiece>::type;
      const T w = *reinterpret_cast<const T*>(reinterpret_cast<const char*>(ptr + i) + b);
      memcpy(reinterpret_cast<char*>(dst) + b, &w, kPiece);
    }
  }
  // Stores go through st.global.v4 / .v2 / scalar PTX: a vector struct copy may be split into
  // scalar stores by the compiler. store_if stores where `pred` holds, as one predicated instruction
  // (no branch around it).
  template <int kCount, class V>
  SS2D_HD SS2D_INLINE void store(V* ptr, int i, const V* src) const {
    store_if<kCount>(true, ptr, i, src);
  }
  template <int kCount, class V>
  SS2D_HD SS2D_INLINE void store_if(bool pred, V* ptr, int i, const V* src) const {
#ifdef __CUDA_ARCH__
    constexpr int kBytes = kCount * static_cast<int>(sizeof(V));
    const unsigned p = pred ? 1u : 0u;
    if constexpr (kBytes == 2) {
      unsigned short w;
      memcpy(&w, src, 2);
      asm volatile("{ .reg .pred p; setp.ne.u32 p, %2, 0; @p st.global.b16 [%0], %1; }" ::"l"(ptr + i), "h"(w),
                   "r"(p)
                   : "memory");
    } else {
      constexpr int kPiece = kBytes > 16 ? 16 : kBytes;
SS2D_UNROLL
      for (int b = 0; b < kBytes; b += kPiece) {
        unsigned w[4];
        memcpy(w, reinterpret_cast<const char*>(src) + b, kPiece);
        const char* at = reinterpret_cast<const char*>(ptr + i) + b;
        if constexpr (kPiece == 16) {
          asm volatile("{ .reg .pred p; setp.ne.u32 p, %5, 0; @p st.global.v4.b32 [%0], {%1, %2, %3, %4}; }" ::"l"(at),
                       "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]), "r"(p)
                       : "memory");
        } else if constexpr (kPiece == 8) {
          asm volatile("{ .reg .pred p; setp.ne.u32 p, %3, 0; @p st.global.v2.b32 [%0], {%1, %2}; }" ::"l"(at),
                       "r"(w[0]), "r"(w[1]), "r"(p)
                       : "memory");
        } else {
          asm volatile("{ .reg .pred p; setp.ne.u32 p, %2, 0; @p st.global.b32 [%0], %1; }" ::"l"(at), "r"(w[0]),
                       "r"(p)
                       : "memory");
        }
      }
    }
#endif
  }

  // Warp shuffles of one value per lane; every lane of the warp takes part.
  SS2D_HD SS2D_INLINE void shfl_up(float (&out)[1], const float (&in)[1], int delta) const {
#ifdef __CUDA_ARCH__
    out[0] = __shfl_up_sync(0xffffffffu, in[0], delta);
#endif
  }
  SS2D_HD SS2D_INLINE void shfl_down(float (&out)[1], const float (&in)[1], int delta) const {
#ifdef __CUDA_ARCH__
    out[0] = __shfl_down_sync(0xffffffffu, in[0], delta);
#endif
  }
  SS2D_HD SS2D_INLINE void shfl_idx(float (&out)[1], const float (&in)[1], const int (&src)[1]) const {
#ifdef __CUDA_ARCH__
    out[0] = __shfl_sync(0xffffffffu, in[0], src[0]);
#endif
  }
};

// Threads per block of the RS kernels and the blocks per SM they are compiled for: 4 warps, 8 blocks
// (32 warps per SM) caps them at 64 registers.
constexpr int kRowsThreads = 128;
constexpr int kRowsMinBlocks = 8;

// The kernel body: warp w of the grid takes item w (grid: ceil(rows_items / warps per block) blocks).
template <class E, int kV, int kLoad, Order kOrder, bool kFromRight, int kPrefetch, int kSteps>
__device__ SS2D_INLINE void rows_forward_kernel(const RowsParams& p) {
  static_assert(kSteps >= 0 && kSteps <= kScanSteps, "kSteps: rows_scan_steps of the plan");
  if ((1 << kSteps) < p.seg_lanes) __trap();  // compiled for narrower segments than launched
  RowsDeviceCtx ctx;
  const long long item = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpLanes;
  if (item >= rows_items(p)) return;
  RowsForward<E, kV, kLoad, kOrder, kFromRight, kPrefetch, kSteps>::run(ctx, p, item);
}

// The four-route kernel body (CrossRowsForward): the same grid rule, RowsParams in the four-route
// layout; kFold: the folded step sizes (a RowsFoldParams; a launch without a projection traps);
// kPrefetch: the rows of u and delta held ahead.
template <class E, int kV, int kLoad, int kSteps, bool kFold = false, int kPrefetch = 1>
__device__ SS2D_INLINE void rows_cross_forward_kernel(
    const typename CrossRowsForward<E, kV, kLoad, kSteps, kFold, kPrefetch>::Params& params) {
  static_assert(kSteps >= 0 && kSteps <= kScanSteps, "kSteps: rows_scan_steps of the plan");
  const RowsParams& p = rows_of(params);
  if ((1 << kSteps) < p.seg_lanes) __trap();
  if (kFold && (fold_rank(params) < 1 || fold_weights(params) == nullptr)) __trap();
  RowsDeviceCtx ctx;
  const long long item = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpLanes;
  if (item >= rows_items(p)) return;
  CrossRowsForward<E, kV, kLoad, kSteps, kFold, kPrefetch>::run(ctx, params, item);
}

}  // namespace rows
}  // namespace vmamba2d
