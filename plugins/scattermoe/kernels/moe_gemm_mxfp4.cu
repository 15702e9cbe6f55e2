// Grouped GEMMs with mxfp4 expert weights (both dtypes), decoded in the k loop (weight_formats.cuh).
#include "moe_gemm_packed.cuh"

namespace ax::scattermoe::detail {
void grouped_gemm_mxfp4(const GroupedGemmArgs& a, cudaStream_t s) { dispatch_grouped_packed<WeightFormat::mxfp4>(a, s); }
}  // namespace ax::scattermoe::detail
