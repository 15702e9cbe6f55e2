// The five passes of the gdn linear_attention backend (kernels/chunk_math.cuh) as launches on a stream: on
// the GPU (kernels/linear_attention.cu, one thread block per chunk or per sequence) and on the host
// (src/host_kernels.cpp, every block in turn with one thread: the tests' way of running the kernels' math
// without a GPU). The host glue (src/linear_attention.cpp) calls them through this table.
#pragma once
#include "chunk_math.cuh"

namespace ax::gdn {

struct Kernels {
  const char* where;  // "cuda", "host"
  // stream: a cudaStream_t on the GPU, ignored on the host. Each throws RuntimeError on a failed launch.
  void (*ut_transform)(const Params& p, void* stream);    // Tm, P, U, W          one block per (chunk, head)
  void (*scan_forward)(const Params& p, void* stream);    // S_in, Vn, final      one per (sequence, head, tile)
  void (*output_forward)(const Params& p, void* stream);  // O                    one per (chunk, head)
  void (*scan_backward)(const Params& p, void* stream);   // dS_out, dVn, dS0     one per (sequence, head, tile)
  void (*chunk_backward)(const Params& p, void* stream);  // dQ, dK, dV, dβ, dG   one per (chunk, head)
};

const Kernels& cuda_kernels();
const Kernels& host_kernels();

}  // namespace ax::gdn
