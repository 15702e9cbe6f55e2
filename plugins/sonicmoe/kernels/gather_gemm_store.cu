// The store epilogue's instantiations (the down projection, dX): W and B2 in either orientation.
#include "gather_gemm.cuh"

namespace ax::sonicmoe::detail {
void launch_store(bool w_kmajor, bool w2_kmajor, const Maps& m, const Params& p, size_t smem, int grid, cudaStream_t s) {
  constexpr int kE = int(Epi::store);
  if (w_kmajor) {
    if (w2_kmajor) launch_rank<true, true, kE>(m, p, smem, grid, s); else launch_rank<true, false, kE>(m, p, smem, grid, s);
  } else {
    if (w2_kmajor) launch_rank<false, true, kE>(m, p, smem, grid, s); else launch_rank<false, false, kE>(m, p, smem, grid, s);
  }
}
}  // namespace ax::sonicmoe::detail
