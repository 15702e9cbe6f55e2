// grouped_gemm.hpp's entry points: the argument checks and the dispatch to the schedule's translation unit.
#include "grouped_gemm.hpp"

#include <algorithm>

namespace ax::sonicmoe::cutlass_gemm {

const char* schedule_name(Schedule s) {
  return s == Schedule::cooperative_128x256 ? "cooperative_128x256" : "pingpong_128x128";
}

size_t grouped_gemm_scratch_bytes(int E, int sms) {
  return std::max(detail::pingpong_128x128_scratch_bytes(E, sms), detail::cooperative_128x256_scratch_bytes(E, sms));
}

const char* launch_grouped_gemm(const GroupedGemmArgs& g, cudaStream_t stream) {
  if (g.E <= 0 || !g.seg || !g.a || !g.w || !g.d || !g.scratch) return "grouped_gemm: missing argument";
  if (reinterpret_cast<uintptr_t>(g.scratch) % 128) return "grouped_gemm: scratch must be 128-byte aligned";
  constexpr int kAlign = 8;  // 16 bytes of bf16
  if (g.K % kAlign || g.N % kAlign || g.lda % kAlign || g.ldw % kAlign || g.ldd % kAlign || (g.c && g.ldc % kAlign))
    return "grouped_gemm: K, N and every row stride must be multiples of 8 elements (16-byte TMA rows)";
  switch (g.schedule) {
    case Schedule::pingpong_128x128: return detail::pingpong_128x128_launch(g, stream);
    case Schedule::cooperative_128x256: return detail::cooperative_128x256_launch(g, stream);
  }
  return "grouped_gemm: unknown schedule";
}

}  // namespace ax::sonicmoe::cutlass_gemm
