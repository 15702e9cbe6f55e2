// bf16 default tile configurations of the scattermoe GEMM engine, 32-bit indexing (the 64-bit variants
// are in moe_gemm_bf16_idx64.cu, the other tiles in moe_gemm_bf16_tiles_*.cu: separate files compile in
// parallel).
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
int grouped_bf16_tiles_a(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ);
int grouped_bf16_tiles_b(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ);
int gram_bf16_tiles_b(int tile, const GramArgs& a, cudaStream_t s, bool occ);

int grouped_bf16(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  using T = __nv_bfloat16;
  switch (tile) {
    case kTile128x16: return grouped_tile32<T, 128, 16, 8, 1, false>(a, s, occ);
    case kTile128x64:
    case kTile64x128: return grouped_bf16_tiles_a(tile, a, s, occ);
    case kTile64x64:
    case kTile128x32: return grouped_bf16_tiles_b(tile, a, s, occ);
    default: return grouped_tile32<T, 128, 128, 2, 4, true>(a, s, occ);
  }
}

int gram_bf16(int tile, const GramArgs& a, cudaStream_t s, bool occ) {
  if (tile == kTileGram128x32) return gram_bf16_tiles_b(tile, a, s, occ);
  return launch_gram<__nv_bfloat16, 128, 16, 8, 1, false>(a, s, occ);
}
}  // namespace ax::scattermoe::detail
