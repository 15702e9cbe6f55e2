// The GLU epilogue's instantiations (gate_up forward and its backward recompute): B2 is lora_b (K-major).
#include "gather_gemm.cuh"

namespace ax::sonicmoe::detail {
void launch_glu(bool w_kmajor, const Maps& m, const Params& p, size_t smem, int grid, cudaStream_t s) {
  constexpr int kE = int(Epi::glu);
  if (w_kmajor) launch_rank<true, true, kE>(m, p, smem, grid, s); else launch_rank<false, true, kE>(m, p, smem, grid, s);
}
}  // namespace ax::sonicmoe::detail
