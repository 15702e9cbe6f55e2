// The one GEMM engine behind every scattermoe kernel: a multistage cp.async pipeline feeding
// mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate) through ldmatrix. Runs on sm_80 and newer.
//
// Operand tiles are copied "as stored" (the contiguous global dimension stays contiguous in shared
// memory, rows padded by 16 bytes so ldmatrix is conflict-free); ldmatrix or ldmatrix.trans then
// produces the fragment the tensor core wants. That one trick covers the NN, NT and TN products that
// forward, dX and the Gram products need, and lets the row gather ride on the operand load (each tile
// row has its own base pointer).
//
// Row base offsets (row * ld) are computed once per tile row; the inner loops only add small column
// offsets. IDX64 selects 64-bit row arithmetic; the launcher picks it only when a row offset can reach
// 2^31 (M * ld), so the common case keeps 32-bit multiplies and divisions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "element.cuh"
#include "moe_gemm.hpp"
#include "weight_formats.cuh"

namespace ax::scattermoe::detail {

constexpr int kThreads = 256;

// Copies a ROWS x COLS tile whose COLS direction is contiguous in global memory into shared memory
// (row pitch COLS + 8). row(r) returns the global address of the row's column 0, or nullptr for a row
// outside the problem; columns at or past `ncols` (counted from col0) read as zero. `vec` selects
// 16-byte cp.async (needs 16-byte aligned rows and ncols % 8 == 0) over element loads.
template <class T, int ROWS, int COLS, class RowFn>
__device__ __forceinline__ void load_tile(T* s, RowFn row, int col0, int ncols, bool vec, const T* dummy) {
  constexpr int kCpr = COLS / 8;
  constexpr int kChunks = ROWS * kCpr;
#pragma unroll
  for (int it = 0; it < (kChunks + kThreads - 1) / kThreads; ++it) {
    const int idx = threadIdx.x + it * kThreads;
    if (kChunks % kThreads != 0 && idx >= kChunks) break;
    const int r = idx / kCpr, c = (idx % kCpr) * 8;
    const T* src = row(r);
    T* dst = s + r * (COLS + 8) + c;
    const int col = col0 + c;
    if (vec) {
      const bool ok = src != nullptr && col < ncols;
      cp_async16(dst, ok ? src + col : dummy, ok ? 16 : 0);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) dst[i] = (src != nullptr && col + i < ncols) ? src[col + i] : from_f<T>(0.f);
    }
  }
}

// Per-thread chunk pointers of an operand tile whose rows are fixed for the whole k loop (computed
// once per block: the row gather, its division and the 64-bit row offset leave the k loop).
// COLS_ADVANCE: the k loop walks along the contiguous columns (A[m, k], W[n, k]);
// otherwise it walks down the rows (W[k, n]), adding k0 * ld.
template <class T, int ROWS, int COLS>
struct Hoisted {
  static constexpr int kCpr = COLS / 8, kChunks = ROWS * kCpr, kIt = (kChunks + kThreads - 1) / kThreads;
  const T* p[kIt];  // the chunk's first element at k0 = 0, nullptr for a row / column chunk outside

  template <class RowFn>
  __device__ __forceinline__ void init_rows_fixed(RowFn row) {  // COLS_ADVANCE
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      const int r = idx / kCpr, c = (idx % kCpr) * 8;
      const T* b = (kChunks % kThreads != 0 && idx >= kChunks) ? nullptr : row(r);
      p[it] = b ? b + c : nullptr;
    }
  }
  __device__ __forceinline__ void init_cols_fixed(const T* base, int64_t ld, int col0, int ncols) {
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      const int r = idx / kCpr, c = (idx % kCpr) * 8;
      const int rem = ncols - (col0 + c);
      const bool ok = !(kChunks % kThreads != 0 && idx >= kChunks) && rem > 0;
      p[it] = ok ? base + (int64_t)r * ld + col0 + c : nullptr;
    }
  }
  // Columns advance: tile at column k0, columns valid below ncols.
  __device__ __forceinline__ void load_cols(T* s, int k0, int ncols, bool vec, const T* dummy) const {
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int r = idx / kCpr, c = (idx % kCpr) * 8;
      T* dst = s + r * (COLS + 8) + c;
      const int col = k0 + c;
      if (vec) {
        const bool ok = p[it] != nullptr && col < ncols;
        cp_async16(dst, ok ? p[it] + k0 : dummy, ok ? 16 : 0);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) dst[i] = (p[it] != nullptr && col + i < ncols) ? p[it][k0 + i] : from_f<T>(0.f);
      }
    }
  }
  // Rows advance: tile rows k0 .. k0 + ROWS, rows valid below nrows; columns from col0, valid below ncols.
  __device__ __forceinline__ void load_rows(T* s, int k0, int64_t ld, int nrows, int col0, int ncols, bool vec,
                                            const T* dummy) const {
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int r = idx / kCpr, c = (idx % kCpr) * 8;
      T* dst = s + r * (COLS + 8) + c;
      const bool ok = p[it] != nullptr && k0 + r < nrows;
      const T* src = ok ? p[it] + (int64_t)k0 * ld : dummy;
      if (vec) {
        cp_async16(dst, src, ok ? 16 : 0);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) dst[i] = (ok && col0 + c + i < ncols) ? src[i] : from_f<T>(0.f);
      }
    }
  }
};

// Row of a gathered operand: idx / div. Without IDX64 the launcher guarantees idx < 2^31 (every index
// is below M and M * ld < 2^31), so one 32-bit division; with IDX64, 32 bits whenever the value allows
// (64-bit division is slow).
template <bool IDX64>
__device__ __forceinline__ int64_t gather_row(int64_t idx, int div) {
  if (div == 1) return idx;
  if (!IDX64 || (idx >= 0 && idx <= 0x7fffffff))
    return static_cast<int64_t>(static_cast<uint32_t>(idx) / static_cast<uint32_t>(div));
  return idx / div;
}
// Element offset of a row: row * ld. Without IDX64 the product is below 2^31 (launcher check).
template <bool IDX64>
__device__ __forceinline__ int64_t row_off(int64_t row, int64_t ld) {
  if constexpr (IDX64) return row * ld;
  else return static_cast<int64_t>(static_cast<uint32_t>(row) * static_cast<uint32_t>(ld));
}

struct Problem {
  // Grouped mode: the tile's expert and row range; Gram mode: the expert's rows (the reduction).
  int e;
  int64_t m0, m_end;
  int n0;  // grouped: first output column; gram: first j
  int i0;  // gram: first i
  int nk1, nk2;
  int kt0;  // first main k-tile (split-K: this block's share of K)
};

// One kernel template for both modes. GRAM=false: grouped GEMM (GroupedGemmArgs);
// GRAM=true: per-expert Gram product (GramArgs), A = P^T and B = Q, both stored with the reduction
// (sorted row) index as the row.
template <class T, int BM, int BN, int WM, int WN, bool W_KMAJ, bool W2_KMAJ, bool GRAM>
struct Kernel {
  static constexpr int BK = 32;
  static constexpr int STAGES = 4;
  static constexpr int WTM = BM / WM, WTN = BN / WN;
  static constexpr int MI = WTM / 16, NI = WTN / 8;
  static_assert(WM * WN * 32 == kThreads, "8 warps");
  static_assert(NI % 2 == 0, "B fragments are loaded two n8 blocks at a time");
  static constexpr bool A_KMAJ = !GRAM;
  static constexpr int A_ELEMS = A_KMAJ ? BM * (BK + 8) : BK * (BM + 8);
  static constexpr int B_ELEMS_K = BN * (BK + 8), B_ELEMS_N = BK * (BN + 8);
  static constexpr int B_ELEMS = B_ELEMS_K > B_ELEMS_N ? B_ELEMS_K : B_ELEMS_N;
  static constexpr int SMEM_BYTES = STAGES * (A_ELEMS + B_ELEMS) * (int)sizeof(T);
};

// WF / W_BLK_ROWS: the main product's W is packed (weight_formats.cuh) instead of dense.
template <class T, int BM, int BN, int WM, int WN, bool W_KMAJ, bool W2_KMAJ, bool GRAM, bool IDX64, class Args,
          WeightFormat WF = WeightFormat::dense, bool W_BLK_ROWS = false>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_kernel(const Args args, int n_tiles_n, unsigned vecmask) {
  using K_ = Kernel<T, BM, BN, WM, WN, W_KMAJ, W2_KMAJ, GRAM>;
  constexpr int BK = K_::BK, STAGES = K_::STAGES, MI = K_::MI, NI = K_::NI, WTM = K_::WTM, WTN = K_::WTN;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);
  T* sB = sA + STAGES * K_::A_ELEMS;

  Problem pb;
  if constexpr (!GRAM) {
    // Raster: groups of kGroupM M-tiles; inside a group the M-tile runs fastest, so the blocks in flight
    // share a few weight column slices (read from HBM once) and a few expert row blocks (L2 resident).
    constexpr int64_t kGroupM = 8;
    const int64_t max_tiles = gridDim.x / n_tiles_n;
    const int64_t group = blockIdx.x / (kGroupM * n_tiles_n);
    const int64_t local = blockIdx.x % (kGroupM * n_tiles_n);
    const int64_t rows_in_group = min(kGroupM, max_tiles - group * kGroupM);
    const int64_t tile = group * kGroupM + local % rows_in_group;
    const int nt = static_cast<int>(local / rows_in_group);
    static_assert(BM == 128 || BM == 64, "launch_prep counts tiles of 128 and 64 rows");
    const int32_t* tile_start = args.tile_start + (BM == 64 ? args.E + 1 : 0);
    if (tile >= tile_start[args.E]) return;
    int lo = 0, hi = args.E - 1;  // largest e with tile_start[e] <= tile
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tile_start[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    pb.e = lo;
    pb.m0 = args.seg[lo] + (tile - tile_start[lo]) * BM;
    pb.m_end = args.seg[lo + 1];
    pb.n0 = nt * BN;
    pb.i0 = 0;
    pb.nk1 = (args.K + BK - 1) / BK;
    pb.nk2 = (args.K2 + BK - 1) / BK;
    pb.kt0 = 0;
    if (args.splits > 1) {  // launcher: K2 = 0; a split without k-tiles still writes its (zero) partial
      const int per = (pb.nk1 + args.splits - 1) / args.splits;
      pb.kt0 = min(static_cast<int>(blockIdx.y) * per, pb.nk1);
      pb.nk1 = min(per, pb.nk1 - pb.kt0);
    }
  } else {
    pb.e = blockIdx.z;
    pb.m0 = args.seg[pb.e];
    pb.m_end = args.seg[pb.e + 1];
    pb.i0 = blockIdx.x * BM;
    pb.n0 = blockIdx.y * BN;
    pb.nk1 = static_cast<int>((pb.m_end - pb.m0 + BK - 1) / BK);
    pb.nk2 = 0;
    pb.kt0 = 0;
  }
  const int nk = pb.nk1 + pb.nk2;
  const T* dummy;
  if constexpr (!GRAM) dummy = static_cast<const T*>(args.a); else dummy = static_cast<const T*>(args.p);

  using HA = Hoisted<T, BM, BK>;
  using HW = Hoisted<T, W_KMAJ ? BN : BK, W_KMAJ ? BK : BN>;
  HA hA;
  HW hW;
  [[maybe_unused]] PackedTile<T, WF, W_BLK_ROWS, W_KMAJ ? BN : BK, W_KMAJ ? BK : BN, W_KMAJ, kThreads> qW;
  if constexpr (!GRAM) {
    const T* A = static_cast<const T*>(args.a);
    hA.init_rows_fixed([&](int r) -> const T* {
      const int64_t m = pb.m0 + r;
      if (m >= pb.m_end || (args.row_expert && args.row_expert[m] < 0)) return nullptr;
      const int64_t ar = args.a_idx ? gather_row<IDX64>(args.a_idx[m], args.a_div) : m;
      return A + row_off<IDX64>(ar, args.lda);
    });
    const T* W = static_cast<const T*>(args.w) + pb.e * args.w_estride;
    if constexpr (WF != WeightFormat::dense) {
      qW.init(pb.e, pb.n0, (vecmask & 256u) != 0);
    } else if constexpr (W_KMAJ) {
      hW.init_rows_fixed([&](int r) -> const T* {
        const int n = pb.n0 + r;
        return n < args.N ? W + (int64_t)n * args.ldw : nullptr;
      });
    } else {
      hW.init_cols_fixed(W, args.ldw, pb.n0, args.N);
    }
  }

  // Loads k-tile kt into stage st.
  auto load = [&](int kt, int st) {
    T* a_s = sA + st * K_::A_ELEMS;
    T* b_s = sB + st * K_::B_ELEMS;
    if constexpr (!GRAM) {
      const bool main = kt < pb.nk1;
      const int k0 = (main ? pb.kt0 + kt : kt - pb.nk1) * BK;
      if (main) {
        hA.load_cols(a_s, k0, args.K, vecmask & 1u, dummy);
        if constexpr (WF != WeightFormat::dense) qW.fetch(args, k0);  // decoded into b_s by store_w, after the MMAs
        else if constexpr (W_KMAJ) hW.load_cols(b_s, k0, args.K, vecmask & 2u, dummy);
        else hW.load_rows(b_s, k0, args.ldw, args.K, pb.n0, args.N, vecmask & 2u, dummy);
      } else {
        const T* A2 = static_cast<const T*>(args.a2);
        load_tile<T, BM, BK>(a_s, [&](int r) -> const T* {
          const int64_t m = pb.m0 + r;
          return m < pb.m_end ? A2 + row_off<IDX64>(m, args.lda2) : nullptr;
        }, k0, args.K2, vecmask & 4u, dummy);
        const T* W2 = static_cast<const T*>(args.w2) + pb.e * args.w2_estride;
        if constexpr (W2_KMAJ) {
          load_tile<T, BN, BK>(b_s, [&](int r) -> const T* {
            const int n = pb.n0 + r;
            return n < args.N ? W2 + (int64_t)n * args.ldw2 : nullptr;
          }, k0, args.K2, vecmask & 8u, dummy);
        } else {
          load_tile<T, BK, BN>(b_s, [&](int r) -> const T* {
            const int k = k0 + r;
            return k < args.K2 ? W2 + (int64_t)k * args.ldw2 : nullptr;
          }, pb.n0, args.N, vecmask & 8u, dummy);
        }
      }
    } else {
      const T* P = static_cast<const T*>(args.p);
      const T* Q = static_cast<const T*>(args.q);
      const int64_t mk = pb.m0 + (int64_t)kt * BK;
      load_tile<T, BK, BM>(a_s, [&](int r) -> const T* {
        const int64_t m = mk + r;
        if (m >= pb.m_end || (args.row_expert && args.row_expert[m] < 0)) return nullptr;
        const int64_t pr = args.p_idx ? gather_row<IDX64>(args.p_idx[m], args.p_div) : m;
        return P + row_off<IDX64>(pr, args.ldp);
      }, pb.i0, args.I, vecmask & 1u, dummy);
      load_tile<T, BK, BN>(b_s, [&](int r) -> const T* {
        const int64_t m = mk + r;
        return m < pb.m_end ? Q + row_off<IDX64>(m, args.ldq) : nullptr;
      }, pb.n0, args.J, vecmask & 2u, dummy);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WN, wn = warp % WN;
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

  // Per-row scale of the main product (gates in dX), applied between the main and the LoRA k-tiles.
  auto apply_row_scale = [&]() {
    if constexpr (!GRAM) {
      if (args.row_scale == nullptr) return;
      const T* rs = static_cast<const T*>(args.row_scale);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t m = pb.m0 + wm * WTM + i * 16 + lane / 4 + h * 8;
          float s = 0.f;
          if (m < pb.m_end && !(args.row_expert && args.row_expert[m] < 0))
            s = to_f(rs[args.rs_idx ? args.rs_idx[m] : m]);
#pragma unroll
          for (int j = 0; j < NI; ++j) {
            acc[i][j][2 * h] *= s;
            acc[i][j][2 * h + 1] *= s;
          }
        }
    }
  };

  auto compute = [&](int st, bool w_kmaj) {
    const T* a_s = sA + st * K_::A_ELEMS;
    const T* b_s = sB + st * K_::B_ELEMS;
    const int q = lane / 8, r8 = lane % 8;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        if constexpr (K_::A_KMAJ) {
          const int row = wm * WTM + i * 16 + lane % 16, col = kk * 16 + (lane / 16) * 8;
          ldsm_x4(af[i], a_s + row * (BK + 8) + col);
        } else {
          const int krow = kk * 16 + r8 + (q / 2) * 8, mcol = wm * WTM + i * 16 + (q % 2) * 8;
          ldsm_x4_t(af[i], a_s + krow * (BM + 8) + mcol);
        }
      }
#pragma unroll
      for (int j = 0; j < NI / 2; ++j) {
        uint32_t t[4];
        if (w_kmaj) {
          const int nrow = wn * WTN + j * 16 + r8 + (q / 2) * 8, kcol = kk * 16 + (q % 2) * 8;
          ldsm_x4(t, b_s + nrow * (BK + 8) + kcol);
        } else {
          const int krow = kk * 16 + r8 + (q % 2) * 8, ncol = wn * WTN + j * 16 + (q / 2) * 8;
          ldsm_x4_t(t, b_s + krow * (BN + 8) + ncol);
        }
        bf[2 * j][0] = t[0];
        bf[2 * j][1] = t[1];
        bf[2 * j + 1][0] = t[2];
        bf[2 * j + 1][1] = t[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) MmaOp<T>::run(acc[i][j], af[i], bf[j]);
    }
  };

  // Packed W: the k-tile fetched by load(kt, .) is decoded into its stage (kt % STAGES, the stage the
  // previous iteration computed: every warp is past it since this iteration's barrier).
  auto store_w = [&](int kt) {
    if constexpr (WF != WeightFormat::dense)
      if (kt < pb.nk1) qW.store(args, sB + (kt % STAGES) * K_::B_ELEMS, (pb.kt0 + kt) * BK);
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load(s, s);
    store_w(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int pf = kt + STAGES - 1;
    if (pf < nk) load(pf, pf % STAGES);
    cp_async_commit();
    if (kt == pb.nk1) apply_row_scale();
    if constexpr (GRAM) {
      compute(kt % STAGES, false);
    } else {
      if (kt < pb.nk1) compute(kt % STAGES, W_KMAJ);
      else compute(kt % STAGES, W2_KMAJ);
    }
    store_w(pf);
  }
  cp_async_wait<0>();
  if (pb.nk2 == 0) apply_row_scale();

  // Epilogue: fp32 accumulators -> dtype, straight to global memory.
  const float alpha = args.alpha;
  if constexpr (!GRAM) {
    if (args.splits > 1) {  // split-K: alpha · this split's sums, fp32, sorted rows (summed by split_k_reduce)
      float* P = args.partial + static_cast<int64_t>(blockIdx.y) * args.M * args.N;
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t m = pb.m0 + wm * WTM + i * 16 + lane / 4 + h * 8;
          if (m >= pb.m_end) continue;
#pragma unroll
          for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
              const int n = pb.n0 + wn * WTN + j * 8 + 2 * (lane % 4) + b;
              if (n < args.N) P[m * args.N + n] = alpha * acc[i][j][2 * h + b];
            }
        }
      return;
    }
    T* C = static_cast<T*>(args.c);
    const T* bias = args.bias ? static_cast<const T*>(args.bias) + pb.e * args.bias_estride : nullptr;
    const bool pair_ok = (vecmask & 16u) != 0;  // ldc and N even, C 4-byte aligned
    const T* D = static_cast<const T*>(args.d);  // split path: + beta * D[m, n] (sorted row m)
    const bool d_pair = (vecmask & 32u) != 0;   // ldd and N even, D 4-byte aligned
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = pb.m0 + wm * WTM + i * 16 + lane / 4 + h * 8;
        if (m >= pb.m_end) continue;
        const bool active = !(args.row_expert && args.row_expert[m] < 0);
        if (!active && args.c_idx) continue;
        const int64_t crow = args.c_idx ? args.c_idx[m] : m;
        T* crow_p = C + row_off<IDX64>(crow, args.ldc);
        const T* drow_p = (D != nullptr && active) ? D + row_off<IDX64>(m, args.ldd) : nullptr;
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const int n = pb.n0 + wn * WTN + j * 8 + 2 * (lane % 4);
          float v0 = alpha * acc[i][j][2 * h], v1 = alpha * acc[i][j][2 * h + 1];
          if (bias && active) {
            if (n < args.N) v0 += to_f(bias[n]);
            if (n + 1 < args.N) v1 += to_f(bias[n + 1]);
          }
          if (drow_p) {
            if (d_pair && n + 1 < args.N) {
              const uint32_t dv = *reinterpret_cast<const uint32_t*>(drow_p + n);
              v0 += args.beta * to_f(reinterpret_cast<const T*>(&dv)[0]);
              v1 += args.beta * to_f(reinterpret_cast<const T*>(&dv)[1]);
            } else {
              if (n < args.N) v0 += args.beta * to_f(drow_p[n]);
              if (n + 1 < args.N) v1 += args.beta * to_f(drow_p[n + 1]);
            }
          }
          if (pair_ok && n + 1 < args.N) {
            *reinterpret_cast<uint32_t*>(crow_p + n) = pack2<T>(v0, v1);
          } else {
            if (n < args.N) crow_p[n] = from_f<T>(v0);
            if (n + 1 < args.N) crow_p[n + 1] = from_f<T>(v1);
          }
        }
      }
  } else {
    T* C = static_cast<T*>(args.c) + pb.e * args.c_estride;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int ii = pb.i0 + wm * WTM + i * 16 + lane / 4 + h * 8;
        if (ii >= args.I) continue;
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const int jj = pb.n0 + wn * WTN + j * 8 + 2 * (lane % 4) + b;
            if (jj < args.J) C[ii * args.ldc_i + jj * args.ldc_j] = from_f<T>(alpha * acc[i][j][2 * h + b]);
          }
      }
  }
}

// 16-byte vector loads of a row-major operand: base aligned, leading dimension and extent multiples of 8.
inline bool vec_ok(const void* p, int64_t ld, int64_t cols) { return p && aligned16(p) && ld % 8 == 0 && cols % 8 == 0; }

// One compiled kernel variant. Returns 0 after launching, or, with occupancy_only, the kernel's resident
// blocks per SM (nothing launched): the tile heuristic weighs configurations by it.
template <class T, int BM, int BN, int WM, int WN, bool W_KMAJ, bool W2_KMAJ, bool IDX64>
int launch_grouped(const GroupedGemmArgs& a, cudaStream_t stream, bool occupancy_only) {
  using K_ = Kernel<T, BM, BN, WM, WN, W_KMAJ, W2_KMAJ, false>;
  auto kern = moe_gemm_kernel<T, BM, BN, WM, WN, W_KMAJ, W2_KMAJ, false, IDX64, GroupedGemmArgs>;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, K_::SMEM_BYTES);
  if (occupancy_only) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, K_::SMEM_BYTES) != cudaSuccess) n = 0;
    return n;
  }
  const int n_tiles_n = (a.N + BN - 1) / BN;
  const int64_t max_tiles = (a.M + BM - 1) / BM + a.E;  // each expert adds at most one partial tile
  const int64_t blocks = max_tiles * n_tiles_n;
  if (blocks == 0 || n_tiles_n == 0) return 0;
  unsigned vm = 0;
  if (vec_ok(a.a, a.lda, a.K)) vm |= 1u;
  if (vec_ok(a.w, a.ldw, W_KMAJ ? a.K : a.N) && a.w_estride % 8 == 0) vm |= 2u;
  if (a.K2 > 0 && vec_ok(a.a2, a.lda2, a.K2)) vm |= 4u;
  if (a.K2 > 0 && vec_ok(a.w2, a.ldw2, W2_KMAJ ? a.K2 : a.N) && a.w2_estride % 8 == 0) vm |= 8u;
  if (a.ldc % 2 == 0 && a.N % 2 == 0 && (reinterpret_cast<uintptr_t>(a.c) & 3u) == 0) vm |= 16u;
  if (a.d && a.ldd % 2 == 0 && a.N % 2 == 0 && (reinterpret_cast<uintptr_t>(a.d) & 3u) == 0) vm |= 32u;
  const unsigned splits = a.splits > 1 ? static_cast<unsigned>(a.splits) : 1u;
  kern<<<dim3(static_cast<unsigned>(blocks), splits), kThreads, K_::SMEM_BYTES, stream>>>(a, n_tiles_n, vm);
  return 0;
}

// One tile configuration of the grouped family, 32-bit indexing: picks the compiled weight-orientation
// variant. MIXED: compiled for mixed orientations of W and the fused LoRA factor too (tile_configs.hpp);
// without it the dispatcher (moe_prep.cu) only sends same-orientation calls.
template <class T, int BM, int BN, int WM, int WN, bool MIXED>
int grouped_tile32(const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  const bool wk = a.w_kmajor, w2k = a.K2 == 0 ? a.w_kmajor : a.w2_kmajor;
  if constexpr (MIXED) {
    if (wk && !w2k) return launch_grouped<T, BM, BN, WM, WN, true, false, false>(a, s, occ);
    if (!wk && w2k) return launch_grouped<T, BM, BN, WM, WN, false, true, false>(a, s, occ);
  }
  return wk ? launch_grouped<T, BM, BN, WM, WN, true, true, false>(a, s, occ)
            : launch_grouped<T, BM, BN, WM, WN, false, false, false>(a, s, occ);
}

// The same with 64-bit indexing, every orientation (only the 128x128 default has it).
template <class T, int BM, int BN, int WM, int WN>
int grouped_tile64(const GroupedGemmArgs& a, cudaStream_t s, bool occ) {
  const bool wk = a.w_kmajor, w2k = a.K2 == 0 ? a.w_kmajor : a.w2_kmajor;
  if (wk) return w2k ? launch_grouped<T, BM, BN, WM, WN, true, true, true>(a, s, occ)
                     : launch_grouped<T, BM, BN, WM, WN, true, false, true>(a, s, occ);
  return w2k ? launch_grouped<T, BM, BN, WM, WN, false, true, true>(a, s, occ)
             : launch_grouped<T, BM, BN, WM, WN, false, false, true>(a, s, occ);
}

template <class T, int BM, int BN, int WM, int WN, bool IDX64>
int launch_gram(const GramArgs& a, cudaStream_t stream, bool occupancy_only) {
  using K_ = Kernel<T, BM, BN, WM, WN, false, false, true>;
  auto kern = moe_gemm_kernel<T, BM, BN, WM, WN, false, false, true, IDX64, GramArgs>;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, K_::SMEM_BYTES);
  if (occupancy_only) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, K_::SMEM_BYTES) != cudaSuccess) n = 0;
    return n;
  }
  if (a.E == 0 || a.I == 0 || a.J == 0) return 0;
  unsigned vm = 0;
  if (vec_ok(a.p, a.ldp, a.I)) vm |= 1u;
  if (vec_ok(a.q, a.ldq, a.J)) vm |= 2u;
  dim3 grid((a.I + BM - 1) / BM, (a.J + BN - 1) / BN, a.E);
  kern<<<grid, kThreads, K_::SMEM_BYTES, stream>>>(a, 1, vm);
  return 0;
}

}  // namespace ax::scattermoe::detail
