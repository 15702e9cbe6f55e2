// The gdn linear_attention backend's two scans (kernels/chunk_math.cuh) as launches on a stream: on the GPU
// (kernels/linear_attention.cu, one thread block per sequence, head and column tile) and on the host
// (src/host_kernels.cpp, every block in turn with one thread: the tests' way of running the kernels' math
// without a GPU). The host glue (src/linear_attention.cpp) calls them through this table.
#pragma once
#include "chunk_math.cuh"

namespace ax::gdn {

struct Kernels {
  const char* where;  // "cuda", "host"
  // stream: a cudaStream_t on the GPU, ignored on the host. Each throws RuntimeError on a failed launch.
  void (*scan_forward)(const Params& p, void* stream);   // S_in, Vn
  void (*scan_backward)(const Params& p, void* stream);  // dS_out, dS_in, dVn
  // The shared memory (bytes) one block may opt in to on `device` (a CUDA index; -1 on the host): the glue
  // picks the scans' staging from it (Params::overlap) and declines what fits in neither.
  int64_t (*smem_limit)(int device);
};

const Kernels& cuda_kernels();
const Kernels& host_kernels();

}  // namespace ax::gdn
