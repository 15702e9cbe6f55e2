// bf16 tiles 64x64, 128x32 (grouped) and 128x32 (gram); same-orientation weights, 32-bit indexing.
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
int grouped_bf16_tiles_b(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  using T = __nv_bfloat16;
  if (tile == kTile64x64) return grouped_tile32<T, 64, 64, 2, 4, false>(a, s, occ);
  return grouped_tile32<T, 128, 32, 4, 2, false>(a, s, occ);  // kTile128x32
}

int gram_bf16_tiles_b(int /*tile*/, const GramArgs& a, cudaStream_t s, bool occ) {
  return launch_gram<__nv_bfloat16, 128, 32, 4, 2, false>(a, s, occ);  // kTileGram128x32
}
}  // namespace ax::scattermoe::detail
