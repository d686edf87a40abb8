// The kernel for the compiler's default target (SSE2 on x86-64): runs on every CPU.
#include "scan_2d_isa.h"

#define VMAMBA2D_ISA baseline
#include "scan_2d_kernel.h"
#include "scan_2d_routes_kernel.h"

VMAMBA2D_INSTANTIATE_ISA_KERNELS(baseline)
