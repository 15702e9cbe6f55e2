// The 64-bit-index variants (calls where M * ld reaches 2^31): the 128x128 grouped tile in every weight
// orientation and the 128x16 Gram tile, bf16 and fp16. Any grouped problem runs on 128x128, so thin
// outputs use it too at this size (rare, and correctness first).
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
int grouped_idx64(const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  if (a.dtype == DType::bf16) return grouped_tile64<__nv_bfloat16, 128, 128, 2, 4>(a, s, occ);
  return grouped_tile64<__half, 128, 128, 2, 4>(a, s, occ);
}

int gram_idx64(const GramArgs& a, cudaStream_t s, bool occ) {
  if (a.dtype == DType::bf16) return launch_gram<__nv_bfloat16, 128, 16, 8, 1, true>(a, s, occ);
  return launch_gram<__half, 128, 16, 8, 1, true>(a, s, occ);
}
}  // namespace ax::scattermoe::detail
