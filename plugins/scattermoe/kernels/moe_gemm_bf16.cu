// bf16 instantiations of the scattermoe GEMM engine (one file per dtype so the two compile in parallel).
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
void grouped_gemm_bf16(const GroupedGemmArgs& a, cudaStream_t s) { dispatch_grouped<__nv_bfloat16>(a, s); }
void gram_gemm_bf16(const GramArgs& a, cudaStream_t s) { launch_gram<__nv_bfloat16>(a, s); }
}  // namespace ax::scattermoe::detail
