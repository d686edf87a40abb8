// The kernel built for AVX-512F (x86-64 with GCC), chosen at run time on CPUs that have it.
#include "scan_2d_isa.h"

#if VMAMBA2D_X86_ISA_BUILDS
// Standard headers first, so that their inline code keeps the default target (it is shared with
// the other builds); only the kernel below is compiled for the wider instruction set.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#pragma GCC target("avx512f,avx2,fma,prefer-vector-width=512")
#define VMAMBA2D_ISA avx512
// The row passes that record running products scan 16 floats per vector (scan_2d_passes.h).
#define VMAMBA2D_ROW_SCAN_FLOATS 16
// The step-size projection's register blocks are one vector wide (scan_2d_routes_kernel.h).
#define VMAMBA2D_VECTOR_BYTES 64
#include "scan_2d_kernel.h"
#include "scan_2d_routes_kernel.h"
#include "scan_2d_lanes_kernel.h"

VMAMBA2D_INSTANTIATE_ISA_KERNELS(avx512)
#endif
