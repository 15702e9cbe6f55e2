// The ping-pong schedule of grouped_gemm.hpp: tile 128x128x64, no cluster (experts of ~128 rows leave little to
// share between CTAs); two consumer warp groups alternate tiles, so one's epilogue overlaps the other's mainloop.
#include "grouped_gemm_impl.cuh"

namespace ax::sonicmoe::cutlass_gemm::detail {
namespace {
using Pingpong = GroupedGemm<Shape<_128, _128, _64>, Shape<_1, _1, _1>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                             cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
}  // namespace

size_t pingpong_128x128_scratch_bytes(int E, int sms) { return Pingpong::scratch_bytes(E, sms); }
const char* pingpong_128x128_launch(const GroupedGemmArgs& g, cudaStream_t stream) { return Pingpong::launch(g, stream); }

}  // namespace ax::sonicmoe::cutlass_gemm::detail
