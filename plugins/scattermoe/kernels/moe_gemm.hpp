// Plain C++ launch interface of the scattermoe CUDA kernels: raw device pointers, sizes and a stream.
// No torch headers here or in the .cu files (nvcc compile time); the ATen glue lives in ../src/.
//
// Every kernel works on the *expert-sorted* row order of a MoE layer: row m (0 <= m < M) of the sorted
// order belongs to expert e when seg[e] <= m < seg[e+1]. Index arrays map a sorted row to the row of
// a tensor stored in another order (token order, scattered order).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "tile_configs.hpp"

namespace ax::scattermoe {

enum class DType { bf16, fp16 };

// 16-byte vector loads and stores need 16-byte aligned addresses.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// From expert segment ends (ends[e] = one past the last sorted row of expert e; expert 0 starts at
// `first`) computes seg[E+1] (segment starts, seg[E] = end of the last) and tile_start[2(E+1)]: the
// first M tile of each expert (tile_start[E] = total tiles) for 128-row tiles, then the same for 64-row
// tiles (tile_start + E + 1). One block; no host synchronisation.
void launch_prep(const int64_t* ends, int E, int64_t first, int64_t* seg, int32_t* tile_start,
                 cudaStream_t stream);

// Packed (quantised) expert weights, decoded inside the GEMM's k loop (kernels/weight_formats.cuh).
// Bit layouts: docs/ops/dequant.md. The weight of expert e is a stored matrix S_e of R x C logical
// elements, C the contiguous direction: R = w_kmajor ? N : K and C = w_kmajor ? K : N of the GEMM, and
// W_e(k, n) = S_e[n][k] (w_kmajor) or S_e[k][n] — exactly how a dense weight is read.
//   nf4  : element (e, r, c) has the flat index i = (e*R + r)*C + c; code = nibble of codes[i/2], HIGH
//          nibble for even i; value = NF4[code] * absmax(i / blocksize), absmax = scales[b] (fp32) or,
//          double-quantised, nested_code[scales[b]] * nested_scales[b / nested_blocksize] + nested_offset.
//   mxfp4: E2M1 codes, blocks of 32 along the op's K, LOW nibble first; scale 2^(s-127) (E8M0 byte).
//   nvfp4: the same with blocks of 16, scale = global_scale[e or 0] * E4M3 byte.
//   For mxfp4/nvfp4 blocks_along_rows says whether the op's K (the packed, blocked axis) runs down the
//   rows of S_e (layout EKN: codes [E, R/2, C], scales [E, R/bs, C]) or along them (ENK: codes
//   [E, R, C/2], scales [E, R, C/bs]).
enum class WeightFormat { dense, nf4, mxfp4, nvfp4 };
struct PackedWeight {
  WeightFormat format = WeightFormat::dense;
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;  // nf4: fp32, or uint8 when double-quantised; mxfp4/nvfp4: uint8
  int blocksize = 0;             // nf4: a power of two; mxfp4 32; nvfp4 16
  bool blocks_along_rows = false;
  const float* global_scale = nullptr;  // nvfp4
  bool global_per_expert = false;
  const float* nested_code = nullptr;    // nf4 double quant: [256]; nullptr when not double-quantised
  const float* nested_scales = nullptr;
  float nested_offset = 0.f;
  int nested_blocksize = 256;  // a power of two
};

// Grouped GEMM over expert segments. For every expert e and sorted row m of its segment:
//   acc    = sum_k A[arow(m), k] * W_e(k, n)                         (k < K)
//   acc    = acc * rs(m)                                            (when row_scale)
//   acc   += sum_j A2[m, j] * W2_e(j, n)                             (j < K2, the fused LoRA term)
//   C[crow(m), n] = alpha * acc + bias[e * bias_estride + n]         (bias optional)
//                   + beta * D[m * ldd + n]                          (addend optional: the split path's
//                                                                     base product, sorted row order)
// arow(m) = a_idx ? a_idx[m] / a_div : m;  crow(m) = c_idx ? c_idx[m] : m;
// Inactive rows (row_expert[m] < 0, routing entries owned by another rank) read nothing (A row and
// addend are zero), and their output row is written as zeros (grouped output) or skipped (c_idx set: the
// caller zeroes scattered outputs first). K = 0 is allowed (the output is bias + addend).
// rs(m) = row_scale[rs_idx ? rs_idx[m] : m];
// W_e(k, n) = w[e * w_estride + (w_kmajor ? n * ldw + k : k * ldw + n)]   (likewise W2),
// or, when wq.format is not dense, decoded from the packed weight wq (w, ldw, w_estride unused).
struct GroupedGemmArgs {
  DType dtype = DType::bf16;
  int E = 0;
  int64_t M = 0;  // rows of the sorted order (an upper bound of the routed rows): sizes the grid
  int N = 0, K = 0, K2 = 0;
  const int64_t* seg = nullptr;        // [E+1], from launch_prep
  const int32_t* tile_start = nullptr; // [2(E+1)], from launch_prep
  const int64_t* row_expert = nullptr; // [M] expert of each sorted row, -1 inactive (optional)
  const void* a = nullptr;
  int64_t lda = 0;
  const int64_t* a_idx = nullptr;
  int a_div = 1;
  const void* w = nullptr;
  int64_t w_estride = 0, ldw = 0;
  bool w_kmajor = false;
  const void* a2 = nullptr;
  int64_t lda2 = 0;
  const void* w2 = nullptr;
  int64_t w2_estride = 0, ldw2 = 0;
  bool w2_kmajor = false;
  const void* row_scale = nullptr;  // dtype elements
  const int64_t* rs_idx = nullptr;
  const void* bias = nullptr;
  int64_t bias_estride = 0;
  float alpha = 1.f;
  void* c = nullptr;
  int64_t ldc = 0;
  const int64_t* c_idx = nullptr;
  const void* d = nullptr;  // addend, [M, ldd]; must not alias c when c_idx is set
  int64_t ldd = 0;
  float beta = 1.f;
  int tile = -1;  // a TileId of the grouped family; -1 (or one not compiled for the call): the default
  PackedWeight wq;  // format dense: W_e comes from w
  // Split-K (thin products with few row tiles, see thin_split_k): `splits` blocks share each tile's K;
  // each writes alpha · its partial sums to partial[split][m][n] (fp32, [splits, M, N], caller's
  // workspace), then a reduction sums them in split order into C (deterministic). Needs K2 = 0, no
  // bias, no addend, dense W.
  int splits = 1;
  float* partial = nullptr;
};
// thin_split_k (tile_configs.hpp) for a call: 1 unless it is a plain product (no LoRA term, bias,
// addend; dense W).
int thin_split_k(const GroupedGemmArgs& args, int sms);
// The compiled-kernel variant a call needs (dtype, 64-bit indexing when M * ld can reach 2^31, mixed
// weight orientations).
TileVariant grouped_variant(const GroupedGemmArgs& args);
void grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);
// The same product for the split path's LoRA add (K = r <= 64, no a_idx / K2 / row_scale, dense W,
// N, ldc, ldd multiples of 8 and 16-byte aligned C, D) as a memory-bound kernel (lora_add.cu). Returns
// false, launching nothing, when the call does not qualify.
bool launch_lora_add(const GroupedGemmArgs& args, cudaStream_t stream);

// The split path's LoRA gradients from one read of G = g · dY in sorted row order (lora_grad.cu):
//   yb[m, j]            = alpha · Σ_n G[m, n] · b[n * ldb + e * r + j]          (B_e(n, j); e = m's expert)
//   db[n * lddb + e*r + j] =       Σ_{m in seg(e)} G[m, n] · xa[m * r + j]       (zero for experts without rows)
// yb rows that are inactive (row_expert < 0) or past seg[E] are written as zeros. Inactive rows of G are
// not masked: their xa rows must be zero (as the thin kernel writes them). Deterministic (fixed-order sums
// of fp32 partials in `workspace`, sized by the plan), no host synchronisation.
struct LoraGradArgs {
  DType dtype = DType::bf16;
  int E = 0, N = 0, r = 0;
  int64_t M = 0;
  const int64_t* seg = nullptr;
  const int64_t* row_expert = nullptr;
  const void* g = nullptr;  // [M, ldg]
  int64_t ldg = 0;
  const void* b = nullptr;  // lora_b [N, ldb]
  int64_t ldb = 0;
  const void* xa = nullptr;  // [M, r] contiguous
  float alpha = 1.f;
  void* yb = nullptr;  // [M, r] contiguous
  void* db = nullptr;
  int64_t lddb = 0;
  float* workspace = nullptr;  // plan.workspace_floats, 16-byte aligned
};
// Grid and workspace of a call; chunks == 0: the kernel does not take this rank (it needs r % 8 == 0,
// r <= 32).
struct LoraGradPlan {
  int64_t chunks = 0, part = 0, max_parts = 0, ps_floats = 0, workspace_floats = 0;
};
LoraGradPlan lora_grad_plan(int64_t M, int N, int r, int E, int sms);
// Returns false, launching nothing, when the call does not qualify (plan, N % 8, ldg % 8, alignment).
bool launch_lora_grad(const LoraGradArgs& args, const LoraGradPlan& plan, cudaStream_t stream);

// Gates of the top-k outputs, reading the expert rows through row_of (the inverse routing permutation,
// launch_inverse_rows: row of `rows` holding scattered entry s = t·k + j, -1 for an inactive entry), or
// rows in scattered order (row s) when row_of is null:
//   combine: y[t, n] = Σ_j gates[t·k + j] · rows[row_of(t·k + j), n]   (launch_gates_combine; y written;
//            gates null: weight 1, the k-sum of dX)
//   grad:    gates[t·k + j] = Σ_n y[t, n] · rows[row_of(t·k + j), n]   (launch_gates_grad; y = dY read,
//                                                                      gates written)
// Inactive entries contribute nothing (their dgates are 0). fp32 accumulation in a fixed order
// (deterministic); gates in the activation dtype, contiguous [T, k]. Both return false, launching
// nothing, unless N, ld_rows, ld_y are multiples of 8, rows and y 16-byte aligned and k <= 16.
struct GatesArgs {
  DType dtype = DType::bf16;
  int64_t T = 0;
  int k = 0, N = 0;
  const void* rows = nullptr;
  int64_t ld_rows = 0;
  const int64_t* row_of = nullptr;  // [T·k]
  void* gates = nullptr;  // const for combine
  void* y = nullptr;      // const for grad
  int64_t ld_y = 0;
};
bool launch_gates_combine(const GatesArgs& args, cudaStream_t stream);
bool launch_gates_grad(const GatesArgs& args, cudaStream_t stream);

// Rows into sorted order: out[m, :] = scale[idx[m]] · src[idx[m] / div, :] for active rows
// (row_expert[m] >= 0), zeros for inactive ones; every m < M is written (scale null: 1). The split
// path's g · dY. Returns false, launching nothing, unless N, ld_src, ld_out are multiples of 8 and
// src, out 16-byte aligned.
struct GatherArgs {
  DType dtype = DType::bf16;
  int64_t M = 0;
  int N = 0;
  const int64_t* row_expert = nullptr;
  const int64_t* idx = nullptr;
  int div = 1;
  const void* src = nullptr;
  int64_t ld_src = 0;
  const void* scale = nullptr;
  void* out = nullptr;
  int64_t ld_out = 0;
};
bool launch_gather_rows(const GatherArgs& args, cudaStream_t stream);

// inv[s] = p for every active sorted row p (row_expert[p] >= 0, s = scattered[p]), -1 elsewhere; inv has
// M entries. No host synchronisation.
void launch_inverse_rows(const int64_t* row_expert, const int64_t* scattered, int64_t M, int64_t* inv,
                         cudaStream_t stream);
// Resident blocks per SM of `tile` for this call's variant (0 when not compiled); launches nothing.
int grouped_occupancy(const GroupedGemmArgs& args, int tile);

// Per-expert Gram product (reduction over the expert's sorted rows, deterministic, no atomics):
//   C_e[i, j] = alpha * sum_{m in seg(e)} P[prow(m), i] * Q[m, j]        (i < I, j < J)
// stored at c[e * c_estride + i * ldc_i + j * ldc_j]; experts without rows get zeros.
// prow(m) = p_idx ? p_idx[m] / p_div : m; inactive rows (row_expert[m] < 0) contribute nothing.
struct GramArgs {
  DType dtype = DType::bf16;
  int E = 0, I = 0, J = 0;
  int64_t M = 0;  // rows of the sorted order (every index and row is below it): picks 32/64-bit indexing
  const int64_t* seg = nullptr;
  const int64_t* row_expert = nullptr;
  const void* p = nullptr;
  int64_t ldp = 0;
  const int64_t* p_idx = nullptr;
  int p_div = 1;
  const void* q = nullptr;
  int64_t ldq = 0;
  float alpha = 1.f;
  void* c = nullptr;
  int64_t c_estride = 0, ldc_i = 0, ldc_j = 0;
  int tile = -1;  // a TileId of the gram family; -1: the default
};
TileVariant gram_variant(const GramArgs& args);
void gram_gemm(const GramArgs& args, cudaStream_t stream);
int gram_occupancy(const GramArgs& args, int tile);

// Zeroes rows [*first_row, M) of a row-major [M, >= n] matrix of 2-byte elements (first_row is a device
// pointer, e.g. seg + E: the rows past the last expert). No host synchronisation.
void launch_zero_rows_from(void* c, int64_t ldc, int64_t n, int64_t M, const int64_t* first_row, cudaStream_t stream);

// The split path's grouped GEMM on Hopper (wgmma_gemm.cu; sm_90 only, bf16), rows in sorted order:
//   out[m, n] = Σ_k A[m, k] · W_e(k, n) + Σ_{j<r} A2[m, j] · W2_e(j, n) + bias[e·bias_estride + n]
// for the rows m of each expert's segment; inactive rows (row_expert[m] < 0) are written as zeros, rows
// past seg[E] are not written. W_e(k, n) = w[(e·N + n)·ldw + k] (w_kmajor, forward: nn.Linear [E, N, K])
// or w[(e·K + k)·ldw + n] (w_kmajor false: an [E, K, N] weight, or [E, N, K] read transposed by the
// backward dX). The LoRA term (r > 0, r % 8 == 0, r <= 64): A2 [M, r] contiguous; W2_e(j, n) =
// w2[n·ldw2 + e·r + j] (w2_kmajor: lora_b [N, r·E], forward) or w2[(e·r + j)·ldw2 + n] (lora_a
// [r·E, N], backward). Returns false, launching nothing, when the
// call does not qualify (alignment: 16-byte bases, leading dimensions multiples of 8; N % 8 == 0).
struct WgmmaGemmArgs {
  int E = 0, N = 0, K = 0, r = 0;
  int64_t M = 0;
  const int64_t* seg = nullptr;
  const int64_t* row_expert = nullptr;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  bool w_kmajor = true;
  const void* a2 = nullptr;
  const void* w2 = nullptr;
  int64_t ldw2 = 0;
  bool w2_kmajor = true;
  const void* bias = nullptr;
  int64_t bias_estride = 0;
  void* out = nullptr;
  int64_t ldo = 0;
};
bool wgmma_gemm_available(int device);  // sm_90 and the driver's tensor-map encoder found
bool launch_wgmma_gemm(const WgmmaGemmArgs& args, cudaStream_t stream);

// Throws std::runtime_error with the CUDA error text if the last launch failed.
void check_launch(const char* what);

}  // namespace ax::scattermoe
