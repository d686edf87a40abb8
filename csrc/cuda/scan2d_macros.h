// Function qualifiers and loop pragmas of the CUDA scan kernels, for nvcc, NVRTC and the host
// compiler (the host emulation). No includes, so NVRTC compiles it without a standard library.
#pragma once

#ifdef __CUDACC__
#define SS2D_HD __host__ __device__
#define SS2D_INLINE __forceinline__
#define SS2D_UNROLL _Pragma("unroll")
#define SS2D_PRAGMA(x) _Pragma(#x)
#define SS2D_UNROLL_BY(n) SS2D_PRAGMA(unroll n)
#else
#define SS2D_HD
#define SS2D_INLINE inline
#define SS2D_UNROLL
#define SS2D_UNROLL_BY(n)
#endif
