// The dGLU epilogue's instantiations (dH' = gather(dY) · W2_eᵀ): B2 is lora_a of down (MN-major).
#include "gather_gemm.cuh"

namespace ax::sonicmoe::detail {
void launch_dglu(bool w_kmajor, const Maps& m, const Params& p, size_t smem, int grid, cudaStream_t s) {
  constexpr int kE = int(Epi::dglu);
  if (w_kmajor) launch_rank<true, false, kE>(m, p, smem, grid, s); else launch_rank<false, false, kE>(m, p, smem, grid, s);
}
}  // namespace ax::sonicmoe::detail
