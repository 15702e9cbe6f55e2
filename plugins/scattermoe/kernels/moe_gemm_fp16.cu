// fp16 instantiations of the scattermoe GEMM engine (one file per dtype so the two compile in parallel).
#include "moe_gemm_impl.cuh"

namespace ax::scattermoe::detail {
void grouped_gemm_fp16(const GroupedGemmArgs& a, cudaStream_t s) { dispatch_grouped<__half>(a, s); }
void gram_gemm_fp16(const GramArgs& a, cudaStream_t s) { launch_gram<__half>(a, s); }
}  // namespace ax::scattermoe::detail
