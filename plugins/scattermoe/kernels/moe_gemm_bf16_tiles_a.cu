// bf16 grouped tiles 128x64 and 64x128 (same-orientation weights, 32-bit indexing: tile_configs.hpp).
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
int grouped_bf16_tiles_a(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  using T = __nv_bfloat16;
  if (tile == kTile128x64) return grouped_tile32<T, 128, 64, 4, 2, false>(a, s, occ);
  return grouped_tile32<T, 64, 128, 2, 4, false>(a, s, occ);  // kTile64x128
}
}  // namespace ax::scattermoe::detail
