// fp16 tile configurations of the scattermoe GEMM engine, 32-bit indexing: the defaults only (fp16 MoE
// training is rare; each extra tile costs build time).
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
int grouped_fp16(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  if (tile == kTile128x16) return grouped_tile32<__half, 128, 16, 8, 1, false>(a, s, occ);
  return grouped_tile32<__half, 128, 128, 2, 4, true>(a, s, occ);
}

int gram_fp16(int /*tile*/, const GramArgs& a, cudaStream_t s, bool occ) {
  return launch_gram<__half, 128, 16, 8, 1, false>(a, s, occ);
}
}  // namespace ax::scattermoe::detail
