// The split path's "LoRA add" (src/split_path.cpp): C[crow(m), n] = alpha · XA[m, :] · B_e[:, n] + bias_e[n]
// + beta · D[m, n], where D is the base product _grouped_mm wrote and the rank r is small. It is a
// memory-bound pass over two [M, N] matrices.
//
// A block takes one 64-row tile of an expert segment and 128 columns; each warp walks the 64 rows 16 at
// a time over its 32 columns and does the rank-r product on the tensor core (mma.sync m16n8k16, fp32
// accumulate, r padded to a multiple of 16 with zeros). B_e's fragments are loaded once per warp and
// kept in registers; XA rows come straight from global memory in fragment layout. No shared memory,
// 90 registers for r <= 16. Measured on H200 (qwen3-30b-a3b shapes), three forms before this one were limited by
// something other than DRAM: fp32 FMAs from shared memory at 159 registers (one block per SM: 0.56
// TB/s), then per-warp set-up and B loads repeated for every 16 x 64 tile (instruction-bound: ~1200
// instructions per warp for 2 KB), then 4-byte accumulator-layout loads and stores that left every
// sector half-used per instruction (L1/L2-bound at ~1.8 TB/s).
//
// Row semantics are the grouped GEMM's (moe_gemm.hpp): inactive rows are written as zeros (grouped
// output) or skipped (scattered output); the element a thread writes is the one it read from D, so C
// may alias D when rows are not scattered.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "element.cuh"
#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
namespace {

constexpr int kRowsLA = 64;   // a block: one 64-row tile of an expert segment (launch_prep's second array)
constexpr int kColsWarp = 32; // x 4 warps of 32 columns; a warp walks the tile's 64 rows 16 at a time
constexpr int kThreadsLA = 128, kColsLA = kColsWarp * kThreadsLA / 32;
constexpr int kPhaseLA = 2;    // 16-row steps whose loads are issued together (see the kernel)

// Two 16-bit elements p[0], p[step] as one register, the first in the low half (fragment order); zero
// past `count` elements. VEC: one 4-byte load (contiguous, aligned pairs).
template <bool VEC>
__device__ __forceinline__ uint32_t load_pair(const uint16_t* p, int64_t step, int count) {
  if (VEC && count >= 2) return *reinterpret_cast<const uint32_t*>(p);
  const uint32_t lo = count >= 1 ? p[0] : 0u;
  const uint32_t hi = count >= 2 ? p[step] : 0u;
  return lo | (hi << 16);
}

// KSTEPS = ceil(r / 16) k-steps of the rank-r product (r <= 64); W_VEC: B_e read as aligned pairs along j.
template <class T, int KSTEPS, bool W_VEC, int PHASE>
__global__ void __launch_bounds__(kThreadsLA) lora_add_kernel(const GroupedGemmArgs a) {
  // The 64-row tile -> (expert, first row): largest e with tile_start64[e] <= tile.
  const int32_t* ts = a.tile_start + a.E + 1;
  const int64_t tile = blockIdx.y;
  if (tile >= ts[a.E]) return;
  int lo = 0, hi = a.E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ts[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const int64_t m0 = a.seg[e] + (tile - ts[e]) * kRowsLA;
  const int64_t m_end = min(a.seg[e + 1], m0 + kRowsLA);
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int n_warp = blockIdx.x * kColsLA + (threadIdx.x / 32) * kColsWarp;
  if (n_warp >= a.N) return;  // the whole warp (mma.sync needs every lane of a warp that goes on)

  // The warp's 32 columns as 4 mma slices of 8, permuted so that the accumulators of thread (g, q)
  // hold the 8 contiguous columns n_warp + 8q ... + 7 (slice t, in-slice column c = 2q' + b is column
  // 8q' + 2t + b): D is read and C written as one 16-byte vector per row and thread, whole 32-byte
  // sectors per warp instruction. (In mma's own column order the 4-byte pieces left every sector
  // half-used per instruction and the pass ran into L1/L2 throughput at ~1.8 TB/s.)
  // B fragments, kept for all the warp's rows: column g of slice t, k pairs 2q and 2q + 8 of each k-step.
  // B_e(j, n) = W[n * ldw + j] (k-major) or W[j * ldw + n].
  const uint16_t* W = static_cast<const uint16_t*>(a.w) + e * a.w_estride;
  const int64_t w_jstep = a.w_kmajor ? 1 : a.ldw, w_nstep = a.w_kmajor ? a.ldw : 1;
  uint32_t bf[KSTEPS][4][2];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int n = n_warp + 8 * (g / 2) + 2 * t + g % 2;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int j = 16 * ks + 2 * q + 8 * i;
        bf[ks][t][i] = n < a.N ? load_pair<W_VEC>(W + n * w_nstep + j * w_jstep, w_jstep, a.K - j) : 0u;
      }
  }
  // The thread's 8 columns (N % 8 == 0: all in or all out) and their bias.
  const int n_thr = n_warp + 8 * q;
  const bool cols_in = n_thr < a.N;
  float bias[8];
  const T* bp = a.bias ? static_cast<const T*>(a.bias) + e * a.bias_estride + n_thr : nullptr;
#pragma unroll
  for (int i = 0; i < 8; ++i) bias[i] = (bp && cols_in) ? to_f(bp[i]) : 0.f;
  const uint16_t* A = static_cast<const uint16_t*>(a.a);
  const bool a_vec = a.lda % 2 == 0 && (reinterpret_cast<uintptr_t>(A) & 3u) == 0;
  const T* D = static_cast<const T*>(a.d);
  T* C = static_cast<T*>(a.c);

  // The tile's inactive rows as two 32-bit masks: one coalesced load per lane instead of a dependent
  // 8-byte load per row and thread (which held the XA loads back: 1.9 vs 2.8 TB/s measured).
  uint32_t inactive_lo = 0, inactive_hi = 0;
  if (a.row_expert) {
    const bool in_lo = m0 + lane < m_end && a.row_expert[m0 + lane] < 0;
    const bool in_hi = m0 + 32 + lane < m_end && a.row_expert[m0 + 32 + lane] < 0;
    inactive_lo = __ballot_sync(0xffffffffu, in_lo);
    inactive_hi = __ballot_sync(0xffffffffu, in_hi);
  }
  // Phases of PHASE 16-row steps: first every load of the phase (D vectors, XA fragments, row indices),
  // then the products and stores. C may alias D, so the compiler cannot move a later row's loads above
  // an earlier row's stores by itself. Measured on H200 (mixtral gate_up, in place): one step at a time
  // 2.4 TB/s, two 2.9, four 2.8 (fewer resident warps); an in-place copy reaches 3.9.
  for (int64_t p0 = m0; p0 < m_end; p0 += 16 * PHASE) {
    uint4 dv[PHASE][2];
    uint32_t af[PHASE][KSTEPS][4];
    int64_t crow[PHASE][2];
    bool valid[PHASE][2], act[PHASE][2];
#pragma unroll
    for (int st = 0; st < PHASE; ++st) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // This thread's rows g and g + 8 of the step's 16.
        const int64_t row = p0 + 16 * st + g + 8 * h;
        valid[st][h] = row < m_end;
        const int o = static_cast<int>(row - m0);  // the row's place in the tile, < 64 when valid
        act[st][h] = valid[st][h] && !(((o < 32 ? inactive_lo >> o : inactive_hi >> (o - 32)) & 1u));
        crow[st][h] = valid[st][h] ? (a.c_idx ? a.c_idx[row] : row) : 0;
        dv[st][h] = (D && valid[st][h] && cols_in) ? *reinterpret_cast<const uint4*>(D + row * a.ldd + n_thr)
                                                   : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // A fragment: rows g / g + 8, k pairs 2q and 2q + 8 (inactive rows read as zero).
          const int h = i % 2, j = 16 * ks + 2 * q + 8 * (i / 2);
          // Loaded whatever the row's expert (the row clamped into the tile), then zeroed when inactive:
          // the load does not wait for row_expert.
          const uint16_t* p = A + min(p0 + 16 * st + g + 8 * h, m_end - 1) * a.lda + j;
          const uint32_t v = a_vec ? load_pair<true>(p, 1, a.K - j) : load_pair<false>(p, 1, a.K - j);
          af[st][ks][i] = act[st][h] ? v : 0u;
        }
    }
#pragma unroll
    for (int st = 0; st < PHASE; ++st) {
      float acc[4][4];
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
        for (int t = 0; t < 4; ++t) MmaOp<T>::run(acc[t], af[st][ks], bf[ks][t]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!valid[st][h] || !cols_in || (!act[st][h] && a.c_idx)) continue;
        uint4 out = make_uint4(0, 0, 0, 0);
        if (act[st][h]) {
          const T* d = reinterpret_cast<const T*>(&dv[st][h]);
          uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
          for (int t = 0; t < 4; ++t)
            o[t] = pack2<T>(a.alpha * acc[t][2 * h] + bias[2 * t] + a.beta * to_f(d[2 * t]),
                            a.alpha * acc[t][2 * h + 1] + bias[2 * t + 1] + a.beta * to_f(d[2 * t + 1]));
        }
        *reinterpret_cast<uint4*>(C + crow[st][h] * a.ldc + n_thr) = out;
      }
    }
  }
}

template <class T, int KSTEPS>
void launch_t(const GroupedGemmArgs& a, dim3 grid, cudaStream_t stream) {
  const bool w_vec = a.w_kmajor && a.ldw % 2 == 0 && a.w_estride % 2 == 0 && (reinterpret_cast<uintptr_t>(a.w) & 3u) == 0;
  if (w_vec) lora_add_kernel<T, KSTEPS, true, kPhaseLA><<<grid, kThreadsLA, 0, stream>>>(a);
  else lora_add_kernel<T, KSTEPS, false, kPhaseLA><<<grid, kThreadsLA, 0, stream>>>(a);
}

template <class T>
void launch_k(const GroupedGemmArgs& a, dim3 grid, cudaStream_t stream) {
  if (a.K <= 16) launch_t<T, 1>(a, grid, stream);
  else if (a.K <= 32) launch_t<T, 2>(a, grid, stream);
  else launch_t<T, 4>(a, grid, stream);
}

}  // namespace
}  // namespace detail

bool launch_lora_add(const GroupedGemmArgs& a, cudaStream_t stream) {
  // Only the split path's shape of call: plain rank-r A in sorted order, no second product, no row scale,
  // dense B, 16-byte vectors on C and D.
  if (a.K < 0 || a.K > 64 || a.K2 != 0 || a.row_scale || a.a_idx || a.wq.format != WeightFormat::dense) return false;
  if (a.N % 8 != 0 || a.ldc % 8 != 0 || !aligned16(a.c)) return false;
  if (a.d && (a.ldd % 8 != 0 || !aligned16(a.d))) return false;
  if (a.E <= 0 || a.M <= 0 || a.N <= 0) return true;  // nothing to write
  const int64_t max_tiles = (a.M + detail::kRowsLA - 1) / detail::kRowsLA + a.E;
  const int64_t col_blocks = (a.N + detail::kColsLA - 1) / detail::kColsLA;
  if (max_tiles > 65535 || col_blocks > 0x7fffffff) return false;  // grid limits: the GEMM kernel takes it
  // Column blocks run fastest: the blocks in flight cover whole rows (long DRAM bursts). With row tiles
  // fastest each DRAM page gave up only one 128-byte strip per visit and the pass ran at ~0.7 TB/s.
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(max_tiles));
  if (a.dtype == DType::bf16) detail::launch_k<__nv_bfloat16>(a, grid, stream);
  else detail::launch_k<__half>(a, grid, stream);
  return true;
}

}  // namespace ax::scattermoe
