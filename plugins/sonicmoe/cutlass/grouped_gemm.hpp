// A grouped GEMM over expert-sorted rows on CUTLASS 3's sm90 pointer-array collectives (TMA loads, a
// warp-specialised persistent mainloop, a TMA-store epilogue that overlaps the next tile's mainloop):
// D_m = A_m · W_e(m) (+ beta · C_m) for the rows m of expert e in [seg[e], seg[e+1]).
// This is issue 42's first step: the store GEMM of sonicmoe (the down projection, dX) on proven
// collectives, measured against the hand-written kernel and at::_grouped_mm (bench/cutlass_grouped_bench.cpp)
// before the plugin calls it. Host interface only (no CUTLASS or CUDA device code here).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ax::sonicmoe::cutlass_gemm {

// The tile and schedule, each instantiated in its own translation unit. The first H100 run (2026-12-07) had the
// ping-pong kernel ahead of _grouped_mm where experts get ~128 rows (qwen3.5, deepseek-v3) and behind where they get
// 500-1000 (olmoe, mixtral), where _grouped_mm runs a cooperative 128x256 tile on 2-CTA clusters: the second
// schedule is that one, for the bench to say where each wins.
enum class Schedule {
  pingpong_128x128,    // two consumer warp groups alternate 128x128x64 tiles (one's epilogue under the other's mainloop)
  cooperative_128x256  // both warp groups on one 128x256x64 tile, clusters of 2 CTAs along M sharing B by multicast
};
const char* schedule_name(Schedule s);

struct GroupedGemmArgs {
  int E = 0;                     // experts (groups)
  const int64_t* seg = nullptr;  // device int64 [E + 1]: the first sorted row of each expert, then M
  int N = 0, K = 0;              // K and N: multiples of 8 (16-byte TMA rows)
  const void* a = nullptr;       // bf16 [M, K] row-major, lda elements a row
  int64_t lda = 0;
  const void* w = nullptr;       // bf16, E contiguous blocks of [N, K] rows (K-major), ldw elements a row
  int64_t ldw = 0;
  const void* c = nullptr;       // optional bf16 [M, N] (ldc), added times beta (e.g. the LoRA term)
  int64_t ldc = 0;
  float beta = 0.f;
  void* d = nullptr;             // bf16 [M, N] row-major (ldd)
  int64_t ldd = 0;
  void* scratch = nullptr;       // device, grouped_gemm_scratch_bytes(E, sms) bytes, 128-byte aligned
  int sms = 0;                   // SMs the persistent grid fills (0: the device's count)
  Schedule schedule = Schedule::pingpong_128x128;
};

// Bytes of device scratch one call needs, whatever its schedule: the per-expert problem shapes, pointers and
// strides a setup kernel writes from seg (so no host sync), plus CUTLASS's own workspace.
size_t grouped_gemm_scratch_bytes(int E, int sms);

// Launches the setup kernel and the GEMM on `stream`; nullptr, or why the call cannot run.
const char* launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream);

namespace detail {  // defined by each schedule's translation unit (grouped_gemm_<schedule>.cu)
size_t pingpong_128x128_scratch_bytes(int E, int sms);
const char* pingpong_128x128_launch(const GroupedGemmArgs& g, cudaStream_t stream);
size_t cooperative_128x256_scratch_bytes(int E, int sms);
const char* cooperative_128x256_launch(const GroupedGemmArgs& g, cudaStream_t stream);
}  // namespace detail

}  // namespace ax::sonicmoe::cutlass_gemm
