// The sonicmoe grouped GEMM (kernels/gather_gemm.cuh): one persistent, warp-specialised sm_90a kernel
// over expert-sorted rows, C_m = A_row(m) · W_e(m) (+ LoRA K tile) with one of three epilogues. Host
// interface only (no CUDA device code); docs/plugins/sonicmoe.md explains the design.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ax::sonicmoe {

// What the epilogue does with the fp32 accumulators of a tile.
//   store: out[m, n] = C + bias_e          (the down projection, dX)
//   glu:   out[m, j] = act(gate_j, up_j) and/or u_out[m, :] = u   (gate_up; u = C + bias_e)
//          halves: the B tile is 128 gate columns + the 128 matching up columns, so one thread holds
//          both halves of a pair; interleaved: a pair is two adjacent columns of the same thread.
//   dglu:  du[m, (gate_j, up_j)] = act'(u_m) · row_scale[m] · C[m, j],  C = dH' (N = I columns);
//          rowsum[m, tile] = Σ_j C[m, j] · act(u_m)_j over the tile's columns (the router-score gradient);
//          h_out[m, j] = act(u_m)_j rounded to bf16 as the forward wrote h (optional: the down LoRA's dA2)
enum class Epi : int { store = 0, glu = 1, dglu = 2 };

struct GatherGemmArgs {
  Epi epi = Epi::store;
  // Routing: M sorted rows in E segments [seg[e], seg[e+1]) (device int64 [E + 1]); row_expert [M]
  // (device int64): -1 marks an inactive row, written as zeros (and, in dglu, a zero rowsum).
  int E = 0;
  int64_t M = 0;
  const int64_t* seg = nullptr;
  const int64_t* row_expert = nullptr;
  // A [*, K] bf16 row-major (lda elements, 16-byte aligned rows): sorted row m reads row a_idx[m] / a_div
  // (the gather: token of the entry) or row m (a_idx null). K: a multiple of 64. The store epilogue takes
  // no gather (a_idx null: its A, h or du, is in sorted-row order and comes by TMA; M rows).
  const void* a = nullptr;
  int64_t lda = 0;
  const int64_t* a_idx = nullptr;
  int a_div = 1;
  int K = 0;
  // B = W_e as [K, N]. w_kmajor: stored as E blocks of [N, K] rows (row n contiguous along K);
  // otherwise E blocks of [K, N]. ldw: row stride; blocks are contiguous (expert e starts at row e·N or e·K).
  const void* w = nullptr;
  bool w_kmajor = true;
  int64_t ldw = 0;
  int N = 0;  // GEMM columns: store: out's width; glu: 2I (u's width); dglu: I
  // LoRA K tile (r = 0: none): a2 [M, r] row-major (the sorted rows' thin product, scale folded in),
  // w2 = B2 as [r, N] per expert: w2_kmajor: [N, E·r] (columns e·r ..), else [E·r, N] (rows e·r ..).
  // r: a multiple of 8, at most 64 (zero-padded ranks are exact: the padding adds zeros).
  int r = 0;
  const void* a2 = nullptr;
  const void* w2 = nullptr;
  bool w2_kmajor = true;
  int64_t ldw2 = 0;
  // Epilogue.
  const void* bias = nullptr;  // store: [E, N]; glu: [E, 2I] (8-byte aligned rows bias_estride elements apart); optional
  int64_t bias_estride = 0;
  void* out = nullptr;  // store: [M, N]; glu: h [M, I] (optional if u_out is set); dglu: du [M, 2I]
  int64_t ldo = 0;
  void* u_out = nullptr;  // glu: u [M, 2I] as well (optional: what the backward's dGLU reads)
  int64_t ldu_out = 0;
  void* h_out = nullptr;  // dglu: h [M, I] (optional)
  int64_t ldh_out = 0;
  bool interleaved = false;  // glu / dglu: gate/up packing
  bool clamped = false;      // glu / dglu: gpt-oss's clamped GLU (else SiLU-GLU)
  float alpha = 1.702f, limit = 7.f;
  const void* u = nullptr;        // dglu: u [M, 2I]
  int64_t ldu = 0;
  const float* row_scale = nullptr;  // dglu: the routing weight of each sorted row (fp32 [M])
  float* rowsum = nullptr;           // dglu: [M, col_tiles] fp32 partial sums (deterministic: no atomics)
  int64_t ld_rowsum = 0;
};

// The most experts a call may have: the kernel keeps a table of E + 1 tile starts in shared memory, next to
// its stages (gather_gemm.cuh checks that it fits).
constexpr int kGatherGemmMaxExperts = 7680;

// The number of column tiles of a call (dglu: the width of rowsum).
int gather_gemm_col_tiles(const GatherGemmArgs& a);

// Launches the kernel on `stream`; returns nullptr, or why the call cannot run (nothing launched then).
const char* launch_gather_gemm(const GatherGemmArgs& a, cudaStream_t stream);

// Whether the kernels run on `device` (sm_90 with an sm_90a cubin, the driver's TMA encoder); else why.
const char* gather_gemm_unavailable(int device);

}  // namespace ax::sonicmoe
