// The block's combine on the GPU: core's row_combine.cuh kernel (shared with scattermoe) behind combine.hpp.
#include <cuda_bf16.h>

#include <axengine/cuda/row_combine.cuh>

#include "combine.hpp"

namespace ax::sonicmoe {

const char* launch_combine(const CombineArgs& a, cudaStream_t stream) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (a.N % 8 != 0 || a.ld_rows % 8 != 0 || a.ld_y % 8 != 0 || !aligned(a.rows) || !aligned(a.y))
    return "combine: rows must be 16-byte aligned multiples of 8 elements";
  if (a.k < 1 || a.k > ax::cuda::kMaxTopK) return "combine: top-k must be 1..16";
  if (a.T * a.k >= (int64_t{1} << 31)) return "combine: more than 2^31 entries";
  if (a.T == 0 || a.N == 0) return nullptr;
  const int64_t blocks = (a.T + 7) / 8;  // 8 warps a block, a token a warp
  const ax::cuda::RowCombine c{a.T, a.k, a.N, a.rows, a.ld_rows, a.inv, a.gates, a.y, a.ld_y};
  ax::cuda::combine_rows_kernel<__nv_bfloat16><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(c);
  return nullptr;
}

}  // namespace ax::sonicmoe
