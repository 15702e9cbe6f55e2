// The split path's LoRA gradient pass (moe_gemm.hpp, LoraGradArgs): from G = g · dY in sorted row order
// ([M, N], which the split path gathers anyway for _grouped_mm's dX) it computes, reading G once,
//   YB[m, j]   = alpha · Σ_n G[m, n] · B_e(n, j)          [M, r]   (then dX's LoRA term and dA)
//   dB_e(n, j) =         Σ_{m ∈ e} G[m, n] · XA[m, j]
// A thin GEMM (YB) and a Gram product (dB) used to read G once each: at mixtral's gate_up, 470 MB twice.
//
// Grid: x = column chunk of CW columns (fastest, so the blocks in flight share rows: long DRAM bursts),
// y = row part (up to `part` rows of one expert; part table from parts_kernel). A block walks its part
// 64 rows at a time and each 64-row step 128 columns at a time, the G tile in shared memory (cp.async,
// a ring of four stages), mma.sync through ldmatrix:
//   YB: warp w owns rows 16w..16w+15 of the step over all CW columns, accumulated in registers across
//       the column sub-chunks, then stored as one fp32 partial per column chunk;
//   dB: warp w owns columns 32w..32w+31 of every sub-chunk, accumulated in registers over the part's
//       rows, then stored as one fp32 partial per part.
// Two small kernels sum the partials in a fixed order (deterministic, no atomics) and write YB and dB.
// Rows past the part read as zeros. Inactive rows need no mask here: their XA rows are zero (the thin
// kernel writes inactive rows as zeros), so they add nothing to dB, and the YB sum writes them as zero.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "element.cuh"
#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
namespace {

constexpr int kThreadsLG = 128;      // 4 warps
constexpr int kStepRows = 64;        // rows per step (warp w: rows 16w.., for YB)
constexpr int kSubCols = 128;        // columns per G tile (warp w: columns 32w.., for dB)
constexpr int kGPitch = kSubCols + 8;  // shared row pitch in elements: conflict-free ldmatrix
constexpr int kStages = 4;            // G tiles in flight per block (cp.async ring)

// ps[e] = first part of expert e, ps[E] = number of parts: expert e has ceil(len_e / part) parts. One
// block: each thread counts a run of experts, then a shared-memory scan (a serial loop took 20 us at E = 128).
constexpr int kPartsThreads = 256;
__global__ void parts_kernel(const int64_t* seg, int E, int64_t part, int32_t* ps) {
  __shared__ int32_t sums[kPartsThreads];
  const int per = (E + kPartsThreads - 1) / kPartsThreads, e0 = threadIdx.x * per, e1 = min(E, e0 + per);
  int32_t n = 0;
  for (int e = e0; e < e1; ++e) n += static_cast<int32_t>((seg[e + 1] - seg[e] + part - 1) / part);
  sums[threadIdx.x] = n;
  __syncthreads();
  for (int off = 1; off < kPartsThreads; off *= 2) {  // inclusive Hillis-Steele scan
    const int32_t v = threadIdx.x >= off ? sums[threadIdx.x - off] : 0;
    __syncthreads();
    sums[threadIdx.x] += v;
    __syncthreads();
  }
  int32_t run = sums[threadIdx.x] - n;
  for (int e = e0; e < e1; ++e) {
    ps[e] = run;
    run += static_cast<int32_t>((seg[e + 1] - seg[e] + part - 1) / part);
  }
  if (threadIdx.x == kPartsThreads - 1) ps[E] = sums[threadIdx.x];
}

// NT: n-tiles of 8 over the padded rank (2: r <= 16, 4: r <= 32); SUBS: 128-column sub-chunks per chunk.
template <class T, int NT, int SUBS>
__global__ void __launch_bounds__(kThreadsLG, 2) lora_grad_kernel(const LoraGradArgs a, int64_t part,
                                                                 const int32_t* ps, float* ws_yb, float* ws_db) {
  constexpr int RP = NT * 8, XPitch = RP + 8, CW = SUBS * kSubCols;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Gs = reinterpret_cast<T*>(smem_raw);            // [kStages][64][kGPitch]
  T* Xs = Gs + kStages * kStepRows * kGPitch;        // [kStages][64][XPitch]
  T* Bs = Xs + kStages * kStepRows * XPitch;         // [CW][XPitch]

  const int z = blockIdx.y;
  if (z >= ps[a.E]) return;
  int lo = 0, hi = a.E - 1;  // the expert of part z: largest e with ps[e] <= z (skips empty experts)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ps[mid] <= z) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const int64_t p0 = a.seg[e] + (z - ps[e]) * part, p1 = min(a.seg[e + 1], p0 + part);
  const int n0 = blockIdx.x * CW;
  const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, g = lane / 4, q = lane % 4;
  const T* G = static_cast<const T*>(a.g);
  const T* XA = static_cast<const T*>(a.xa);

  // B_e's columns of this chunk, [CW][RP] (zero past N and r), once per block: 16-byte copies when rows
  // and the expert's column offset allow (r % 8 == 0 always; ldb and the base decide).
  const T* B = static_cast<const T*>(a.b) + e * static_cast<int64_t>(a.r);
  if (a.ldb % 8 == 0 && (reinterpret_cast<uintptr_t>(a.b) & 15u) == 0) {
    for (int id = tid; id < CW * NT; id += kThreadsLG) {
      const int nl = id / NT, ch = id % NT, n = n0 + nl;
      const bool ok = n < a.N && 8 * ch < a.r;
      cp_async16(Bs + nl * XPitch + 8 * ch, ok ? B + n * a.ldb + 8 * ch : B, ok ? 16 : 0);
    }
  } else {
    for (int i = tid; i < CW * RP; i += kThreadsLG) {
      const int nl = i / RP, j = i % RP, n = n0 + nl;
      Bs[nl * XPitch + j] = (n < a.N && j < a.r) ? B[n * a.ldb + j] : from_f<T>(0.f);
    }
  }

  // Unit u = (row step u / SUBS, sub-chunk u % SUBS): its G tile into ring slot u % kStages, and with
  // the first sub-chunk the step's XA rows. Units past the part load nothing (the group stays counted).
  const int steps = static_cast<int>((p1 - p0 + kStepRows - 1) / kStepRows), units = steps * SUBS;
  auto load_unit = [&](int u) {
    if (u >= units) return;
    const int s = u % SUBS, slot = u % kStages;
    const int64_t r0 = p0 + int64_t{u / SUBS} * kStepRows;
    T* gs = Gs + slot * kStepRows * kGPitch;
#pragma unroll
    for (int k = 0; k < kStepRows * kSubCols / 8 / kThreadsLG; ++k) {
      const int id = tid + k * kThreadsLG, i = id / (kSubCols / 8), ch = id % (kSubCols / 8);
      const int64_t row = r0 + i;
      const int col = n0 + s * kSubCols + 8 * ch;
      const bool ok = row < p1 && col < a.N;
      cp_async16(gs + i * kGPitch + 8 * ch, ok ? G + row * a.ldg + col : G, ok ? 16 : 0);
    }
    if (s == 0) {  // XA slot by step: at most kStages steps have units in flight
      T* xs = Xs + ((u / SUBS) % kStages) * kStepRows * XPitch;
      for (int id = tid; id < kStepRows * NT; id += kThreadsLG) {
        const int i = id / NT, ch = id % NT;
        const int64_t row = r0 + i;
        const bool ok = row < p1 && 8 * ch < a.r;
        cp_async16(xs + i * XPitch + 8 * ch, ok ? XA + row * a.r + 8 * ch : XA, ok ? 16 : 0);
      }
    }
  };

  float acc_db[SUBS][2][NT][4];
#pragma unroll
  for (int s = 0; s < SUBS; ++s)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_db[s][mt][nt][i] = 0.f;

  // Prologue: kStages - 1 units in flight (B_e rides in the first group).
#pragma unroll
  for (int u = 0; u < kStages - 1; ++u) {
    load_unit(u);
    cp_async_commit();
  }
  const int lrow = (lane % 8) + 8 * ((lane / 8) % 2), lcol = 8 * (lane / 16);  // ldmatrix lane address
  for (int t = 0; t < steps; ++t) {
    const int64_t r0 = p0 + int64_t{t} * kStepRows;
    const T* xs = Xs + (t % kStages) * kStepRows * XPitch;
    float acc_yb[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_yb[nt][i] = 0.f;
#pragma unroll
    for (int s = 0; s < SUBS; ++s) {
      const int u = t * SUBS + s;
      cp_async_wait<kStages - 2>();  // unit u has landed
      __syncthreads();               // ... for every thread, and unit u - 1's slot is free again
      load_unit(u + kStages - 1);
      cp_async_commit();
      const T* gs = Gs + (u % kStages) * kStepRows * kGPitch;
      // YB: rows 16w.. (A = G, row-major) times B_e's 128 rows of this sub-chunk (k = column).
#pragma unroll
      for (int ks = 0; ks < kSubCols / 16; ++ks) {
        uint32_t af[4];
        ldsm_x4(af, gs + (16 * w + lrow) * kGPitch + 16 * ks + lcol);
#pragma unroll
        for (int nb = 0; nb < NT / 2; ++nb) {
          uint32_t bf[4];
          ldsm_x4_t(bf, Bs + (s * kSubCols + 16 * ks + lrow) * XPitch + 16 * nb + lcol);
          MmaOp<T>::run(acc_yb[2 * nb], af, bf);
          MmaOp<T>::run(acc_yb[2 * nb + 1], af, bf + 2);
        }
      }
      // dB: columns 32w.. (A = Gᵀ through ldmatrix.trans) times XA (k = row).
#pragma unroll
      for (int ks = 0; ks < kStepRows / 16; ++ks) {
        uint32_t xf[NT / 2][4];
#pragma unroll
        for (int nb = 0; nb < NT / 2; ++nb) ldsm_x4_t(xf[nb], xs + (16 * ks + lrow) * XPitch + 16 * nb + lcol);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t af[4];
          ldsm_x4_t(af, gs + (16 * ks + (lane % 8) + 8 * (lane / 16)) * kGPitch + 32 * w + 16 * mt + 8 * ((lane / 8) % 2));
#pragma unroll
          for (int nb = 0; nb < NT / 2; ++nb) {
            MmaOp<T>::run(acc_db[s][mt][2 * nb], af, xf[nb]);
            MmaOp<T>::run(acc_db[s][mt][2 * nb + 1], af, xf[nb] + 2);
          }
        }
      }
    }
    // This chunk's YB partial for the warp's 16 rows.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = r0 + 16 * w + g + 8 * h;
      if (m >= p1) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int j = 8 * nt + 2 * q;
        if (j < a.r)
          *reinterpret_cast<float2*>(ws_yb + (blockIdx.x * a.M + m) * a.r + j) =
              make_float2(acc_yb[nt][2 * h], acc_yb[nt][2 * h + 1]);
      }
    }
  }
  cp_async_wait<0>();
  // This part's dB for the warp's columns: the final value when it is the expert's only part (most
  // experts, with the plan's part size), else an fp32 partial for db_reduce_kernel.
  const bool only_part = ps[e + 1] - ps[e] == 1;
  T* db = static_cast<T*>(a.db) + e * static_cast<int64_t>(a.r);
#pragma unroll
  for (int s = 0; s < SUBS; ++s)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + s * kSubCols + 32 * w + 16 * mt + g + 8 * h;
        if (n >= a.N) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int j = 8 * nt + 2 * q;
          if (j >= a.r) continue;
          const float v0 = acc_db[s][mt][nt][2 * h], v1 = acc_db[s][mt][nt][2 * h + 1];
          if (only_part) {
            db[n * a.lddb + j] = from_f<T>(v0);
            db[n * a.lddb + j + 1] = from_f<T>(v1);
          } else {
            *reinterpret_cast<float2*>(ws_db + (int64_t{z} * a.N + n) * a.r + j) = make_float2(v0, v1);
          }
        }
      }
}

// YB[m, j] = alpha · Σ_c ws_yb[c][m][j] for active rows of an expert, zero elsewhere.
template <class T>
__global__ void yb_reduce_kernel(const LoraGradArgs a, int64_t chunks, const float* ws_yb) {
  const int64_t total = a.M * a.r, end = a.seg[a.E];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t m = i / a.r;
    float v = 0.f;
    if (m < end && !(a.row_expert && a.row_expert[m] < 0))
      for (int64_t c = 0; c < chunks; ++c) v += ws_yb[c * total + i];
    static_cast<T*>(a.yb)[i] = from_f<T>(a.alpha * v);
  }
}

// dB[n, e r + j] = Σ over expert e's parts (in order) of ws_db[z][n][j], for experts of several parts
// (block x = expert; the others return at once); zero for experts without rows.
template <class T>
__global__ void db_reduce_kernel(const LoraGradArgs a, const int32_t* ps, const float* ws_db) {
  const int e = blockIdx.x, z0 = ps[e], z1 = ps[e + 1];
  if (z1 - z0 == 1) return;  // written by the main kernel
  const int64_t total = int64_t{a.N} * a.r;
  T* db = static_cast<T*>(a.db) + e * int64_t{a.r};
  for (int64_t i = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.y} * blockDim.x) {
    float v = 0.f;
    for (int z = z0; z < z1; ++z) v += ws_db[int64_t{z} * total + i];
    db[(i / a.r) * a.lddb + i % a.r] = from_f<T>(v);
  }
}

template <class T, int NT, int SUBS>
void launch_t(const LoraGradArgs& a, const LoraGradPlan& p, cudaStream_t stream) {
  constexpr int RP = NT * 8;
  constexpr size_t smem =
      sizeof(T) * (kStages * kStepRows * kGPitch + kStages * kStepRows * (RP + 8) + SUBS * kSubCols * (RP + 8));
  auto kernel = lora_grad_kernel<T, NT, SUBS>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  int32_t* ps = reinterpret_cast<int32_t*>(a.workspace);
  float* ws_yb = a.workspace + p.ps_floats;
  float* ws_db = ws_yb + p.chunks * a.M * a.r;
  parts_kernel<<<1, kPartsThreads, 0, stream>>>(a.seg, a.E, p.part, ps);
  const dim3 grid(static_cast<unsigned>(p.chunks), static_cast<unsigned>(p.max_parts));
  kernel<<<grid, kThreadsLG, smem, stream>>>(a, p.part, ps, ws_yb, ws_db);
  const int64_t yb_n = a.M * a.r, db_n = int64_t{a.N} * a.E * a.r;
  yb_reduce_kernel<T><<<static_cast<unsigned>(std::min<int64_t>((yb_n + 255) / 256, 4096)), 256, 0, stream>>>(a, p.chunks, ws_yb);
  const dim3 db_grid(static_cast<unsigned>(a.E), static_cast<unsigned>(std::min<int64_t>((db_n / a.E + 255) / 256, 64)));
  db_reduce_kernel<T><<<db_grid, 256, 0, stream>>>(a, ps, ws_db);
}

template <class T>
void launch_r(const LoraGradArgs& a, const LoraGradPlan& p, cudaStream_t stream) {
  if (a.r <= 16) launch_t<T, 2, 4>(a, p, stream);
  else launch_t<T, 4, 2>(a, p, stream);
}

}  // namespace
}  // namespace detail

LoraGradPlan lora_grad_plan(int64_t M, int N, int r, int E, int sms) {
  LoraGradPlan p;
  if (r < 1 || r > 32 || r % 8 != 0 || M <= 0 || N <= 0 || E <= 0) return p;  // unsupported: chunks = 0
  const int cw = r <= 16 ? 4 * detail::kSubCols : 2 * detail::kSubCols;  // what the dB registers allow
  p.chunks = (N + cw - 1) / cw;
  // Rows per part: about 4 blocks per SM over the grid, in whole 64-row steps. Smaller parts mean more
  // blocks but a larger dB partial (one [N, r] fp32 slab per part).
  // An expert of average size splits into a whole number of parts (a part of 192 rows for experts of
  // 256 left a 64-row remainder in a block of its own); an expert of one part needs no dB partial.
  const int64_t target_parts = std::max<int64_t>(1, (4 * int64_t{sms} + p.chunks - 1) / p.chunks);
  const double target_rows = double(M) / double(target_parts), avg = double(M) / double(E);
  const int64_t per_expert = std::max<int64_t>(1, std::llround(avg / std::max(target_rows, 1.0)));
  // One part per expert: room for 25% more rows than average, so that random routing's larger experts
  // do not spill a few rows into a second part (half of them did at qwen3-30b-a3b with parts of 256).
  const int64_t rows = static_cast<int64_t>(std::ceil(per_expert == 1 ? 1.25 * avg : avg / double(per_expert)));
  p.part = std::clamp<int64_t>((rows + detail::kStepRows - 1) / detail::kStepRows * detail::kStepRows,
                               detail::kStepRows, 1 << 20);
  p.max_parts = (M + p.part - 1) / p.part + E;
  p.ps_floats = (E + 1 + 3) / 4 * 4;  // int32 part table, 16-byte aligned partials after it
  p.workspace_floats = p.ps_floats + p.chunks * M * r + p.max_parts * int64_t{N} * r;
  return p;
}

bool launch_lora_grad(const LoraGradArgs& a, const LoraGradPlan& p, cudaStream_t stream) {
  if (p.chunks <= 0 || p.max_parts > 65535 || p.chunks > 0x7fffffff) return false;
  if (a.N % 8 != 0 || a.ldg % 8 != 0 || !aligned16(a.g) || !aligned16(a.xa) || !aligned16(a.workspace)) return false;
  if (a.dtype == DType::bf16) detail::launch_r<__nv_bfloat16>(a, p, stream);
  else detail::launch_r<__half>(a, p, stream);
  return true;
}

}  // namespace ax::scattermoe
