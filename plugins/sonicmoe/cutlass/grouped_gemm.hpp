// A grouped GEMM over expert-sorted rows on CUTLASS 3's sm90 pointer-array collectives (TMA loads, a
// warp-specialised persistent ping-pong mainloop, a TMA-store epilogue that overlaps the next tile's
// mainloop): D_m = A_m · W_e(m) (+ beta · C_m) for the rows m of expert e in [seg[e], seg[e+1]).
// This is issue 42's first step: the store GEMM of sonicmoe (the down projection, dX) on proven
// collectives, measured against the hand-written kernel (bench/cutlass_grouped_bench.cpp) before the
// plugin calls it. Host interface only (no CUTLASS or CUDA device code here).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ax::sonicmoe::cutlass_gemm {

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
};

// Bytes of device scratch one call needs: the per-expert problem shapes, pointers and strides a setup
// kernel writes from seg (so no host sync), plus CUTLASS's own workspace.
size_t grouped_gemm_scratch_bytes(int E, int sms);

// Launches the setup kernel and the GEMM on `stream`; nullptr, or why the call cannot run.
const char* launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream);

}  // namespace ax::sonicmoe::cutlass_gemm
