// Host-side entry points of the CUDA kernels (defined in selective_scan_2d_fwd.cu / _bwd.cu).
// Plain C++ so the ATen-facing code can be compiled by the host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include "scan2d_common.h"

namespace vmamba2d {
namespace scan2d {

// grid = (g.batch_blocks, g.dim), nwarps * 32 threads, smem_bytes of dynamic shared memory.
void launch_forward(const Params& p, ElementType type, int nwarps, size_t smem_bytes,
                    cudaStream_t stream);

// grid = (g.batch_blocks, g.dim / p.channels_per_block).
void launch_backward(const Params& p, ElementType type, int nwarps, size_t smem_bytes,
                     cudaStream_t stream);

}  // namespace scan2d
}  // namespace vmamba2d
