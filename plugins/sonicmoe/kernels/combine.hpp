// The block's combine (kernels/combine.cu): y[t] = Σ_j gates[t, j] · rows[inv[t·k + j]] over the k entries
// of token t, bf16 in and out, fp32 sums in a fixed order (deterministic); inv < 0 (an inactive entry)
// contributes nothing, gates null is weight 1 (dX's k-sum). Host interface only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ax::sonicmoe {

struct CombineArgs {
  int64_t T = 0;
  int k = 0, N = 0;
  const void* rows = nullptr;  // [M, N] bf16, ld_rows elements apart
  int64_t ld_rows = 0;
  const int64_t* inv = nullptr;  // [T·k]: the sorted row of each (token, slot), -1 inactive
  const void* gates = nullptr;   // [T, k] bf16, or null
  void* y = nullptr;             // [T, N] bf16, ld_y elements apart
  int64_t ld_y = 0;
};

// Launches on `stream`; nullptr, or why it cannot run (nothing launched then): N and the row strides
// multiples of 8, rows and y 16-byte aligned, k <= 16, T·k < 2^31.
const char* launch_combine(const CombineArgs& a, cudaStream_t stream);

}  // namespace ax::sonicmoe
