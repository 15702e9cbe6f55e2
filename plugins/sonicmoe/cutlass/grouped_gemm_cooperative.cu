// The cooperative schedule of grouped_gemm.hpp: tile 128x256x64 on clusters of 2 CTAs along M (B's tile reaches
// both by TMA multicast), both consumer warp groups on one tile: for experts with many rows (olmoe, mixtral), the
// configuration at::_grouped_mm runs there.
#include "grouped_gemm_impl.cuh"

namespace ax::sonicmoe::cutlass_gemm::detail {
namespace {
using Cooperative = GroupedGemm<Shape<_128, _256, _64>, Shape<_2, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
}  // namespace

size_t cooperative_128x256_scratch_bytes(int E, int sms) { return Cooperative::scratch_bytes(E, sms); }
const char* cooperative_128x256_launch(const GroupedGemmArgs& g, cudaStream_t stream) { return Cooperative::launch(g, stream); }

}  // namespace ax::sonicmoe::cutlass_gemm::detail
