// norm_rope forward and backward (docs/ops/norm_rope.md): RMSNorm over head_dim, scale by w or 1 + w,
// rotate-half RoPE over the first R columns. One launch each way (plus the dweight partial reduce).
// Two paths: the heads-major one below (bf16/fp16 with D 64 or 128: every model we run) and the general
// one described here (any D up to 256, any even R, fp32, strided rows).
//
// A block of 256 threads takes a group of tokens at a time (tokens_per_iteration: enough that the group's
// rows fill the block). First it builds the group's cos/sin table in shared memory — computed in fp32
// from position · inv_freq with sincosf (never read from memory), or converted from the given cos/sin —
// so a token's rotation is made once, not once per head. Then each row [D] goes to a half-warp (D <= 128
// in 16-byte vectors) or a warp: the lanes hold the row in registers (fp32), sum squares by a fixed
// butterfly, and stage the values the rotation pairs across lanes (column i with i ± R/2) in a shared row,
// so any R (even, <= D) works without lane arithmetic.
//
// Backward: dh = [g·cos − rotate_half(g·sin), g_pass], dn = dh·w', dx = rstd·(dn − n·mean(dn·n)).
// dweight = Σ_rows dh·n: each lane accumulates its columns over the rows its block sees (a fixed grid,
// fixed row order), the block sums its slots in ascending order into partial[block], and
// launch_reduce_partials sums the blocks in ascending order: deterministic, no atomics.
#include "../src/plan.hpp"
#include "common.cuh"

namespace ax::fused_attn {
namespace {

using namespace dev;

template <int VEC, int L>
struct Shape {
  static constexpr int P = plan::kNormRopeThreads / L;  // rows in parallel per block
  // Chunks of VEC columns per lane: a half-warp is only chosen when the row has <= 16 chunks.
  static constexpr int NC = plan::norm_rope_chunk_cap(L, VEC);
  static constexpr int E = NC * VEC;  // columns per lane
};

// The group's cos/sin table: tc[tt·R + i], ts[tt·R + i] for token t0 + tt.
__device__ void fill_table(const NormRopeArgs& a, int64_t t0, int ntok, float* tc, float* ts) {
  const int R = a.R, half = R / 2;
  for (int k = threadIdx.x; k < ntok * R; k += blockDim.x) {
    const int tt = k / R, i = k - tt * R;
    const int64_t t = t0 + tt;
    float c, s;
    if (a.pos.p) {
      const int64_t p = static_cast<const int64_t*>(a.pos.p)[t * a.pos.s];
      const float f = static_cast<const float*>(a.inv_freq.p)[static_cast<int64_t>(i % half) * a.inv_freq.s];
      sincosf(static_cast<float>(p) * f, &s, &c);  // as HF: fp32 position · inv_freq, then cos/sin
      c *= a.scaling;
      s *= a.scaling;
    } else {
      c = load_any(a.cos.p, a.cs_dtype, t * a.cos.ld + i * a.cos.si);
      s = load_any(a.sin.p, a.cs_dtype, t * a.sin.ld + i * a.sin.si);
    }
    tc[k] = c;
    ts[k] = s;
  }
}

// The scale w' (w or 1 + w) in shared memory: any stride, read once per block.
template <class T>
__device__ void fill_weight(const NormRopeArgs& a, float* wsh) {
  const T* w = static_cast<const T*>(a.w.p);
  for (int i = threadIdx.x; i < a.D; i += blockDim.x) {
    const float v = to_f(w[i * a.w.s]);
    wsh[i] = a.weight_offset ? 1.f + v : v;
  }
}

// The lane's columns of one row (zeros where inactive or past D).
template <class T, int VEC, int L, int NC>
__device__ __forceinline__ void load_row(const T* row, int64_t si, int D, int ln, bool active, float* v) {
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c0 = (ln + k * L) * VEC;
    if (active && c0 < D) {
      load<T, VEC>(row + c0 * si, v + k * VEC);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[k * VEC + j] = 0.f;
    }
  }
}

template <class T, int VEC, int L, int NC>
__device__ __forceinline__ void store_row(T* row, int64_t si, int D, int ln, const float* v) {
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c0 = (ln + k * L) * VEC;
    if (c0 < D) store<T, VEC>(row + c0 * si, v + k * VEC);
  }
}

template <class T, int VEC, int L>
__global__ void __launch_bounds__(plan::kNormRopeThreads) norm_rope_fwd(NormRopeArgs a, int tpi) {
  using S = Shape<VEC, L>;
  extern __shared__ float smem[];
  const int D = a.D, R = a.R, half = R / 2;
  float* tc = smem;
  float* ts = tc + tpi * R;
  float* stage = ts + tpi * R;
  float* wsh = stage + S::P * D;
  const int slot = threadIdx.x / L, ln = threadIdx.x % L;
  float* mine = stage + slot * D;
  const T* x = static_cast<const T*>(a.x.p);
  T* y = static_cast<T*>(a.y.p);
  fill_weight<T>(a, wsh);

  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpi; t0 < a.tokens;
       t0 += static_cast<int64_t>(gridDim.x) * tpi) {
    const int ntok = static_cast<int>(min(static_cast<int64_t>(tpi), a.tokens - t0));
    fill_table(a, t0, ntok, tc, ts);
    __syncthreads();
    const int rows = ntok * a.heads;
    for (int qb = 0; qb < rows; qb += S::P) {  // uniform over the block: every lane reaches the shuffles
      const int q = qb + slot;
      const bool active = q < rows;
      const int tt = active ? q / a.heads : 0, h = active ? q - tt * a.heads : 0;
      const int64_t t = t0 + tt;
      float v[S::E];
      load_row<T, VEC, L, S::NC>(x + t * a.x.st + h * a.x.sh, a.x.si, D, ln, active, v);
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < S::E; ++e) ss += v[e] * v[e];
      ss = group_sum<L>(ss);
      const float rstd = active ? rsqrtf(ss / D + a.eps) : 0.f;
#pragma unroll
      for (int e = 0; e < S::E; ++e) {
        const int col = (ln + (e / VEC) * L) * VEC + e % VEC;
        if (col < D) {
          v[e] = v[e] * rstd * wsh[col];
          if (col < R) mine[col] = v[e];
        }
      }
      __syncwarp();
      const float* c = tc + tt * R;
      const float* s = ts + tt * R;
#pragma unroll
      for (int e = 0; e < S::E; ++e) {
        const int col = (ln + (e / VEC) * L) * VEC + e % VEC;
        if (col < R) {
          const float partner = col < half ? -mine[col + half] : mine[col - half];
          v[e] = v[e] * c[col] + partner * s[col];
        }
      }
      if (active) store_row<T, VEC, L, S::NC>(y + t * a.y.st + h * a.y.sh, a.y.si, D, ln, v);
      __syncwarp();  // the staging row is rewritten by the next row
    }
    __syncthreads();  // the table is rewritten by the next group
  }
}

template <class T, int VEC, int L>
__global__ void __launch_bounds__(plan::kNormRopeThreads) norm_rope_bwd(NormRopeArgs a, int tpi) {
  using S = Shape<VEC, L>;
  extern __shared__ float smem[];
  const int D = a.D, R = a.R, half = R / 2;
  float* tc = smem;
  float* ts = tc + tpi * R;
  float* stage = ts + tpi * R;
  float* wsh = stage + S::P * D;
  const int slot = threadIdx.x / L, ln = threadIdx.x % L;
  float* mine = stage + slot * D;
  const T* x = static_cast<const T*>(a.x.p);
  const T* gy = static_cast<const T*>(a.gy.p);
  T* dx = static_cast<T*>(a.dx.p);
  fill_weight<T>(a, wsh);
  float acc[S::E];
#pragma unroll
  for (int e = 0; e < S::E; ++e) acc[e] = 0.f;

  for (int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpi; t0 < a.tokens;
       t0 += static_cast<int64_t>(gridDim.x) * tpi) {
    const int ntok = static_cast<int>(min(static_cast<int64_t>(tpi), a.tokens - t0));
    fill_table(a, t0, ntok, tc, ts);
    __syncthreads();
    const int rows = ntok * a.heads;
    for (int qb = 0; qb < rows; qb += S::P) {
      const int q = qb + slot;
      const bool active = q < rows;
      const int tt = active ? q / a.heads : 0, h = active ? q - tt * a.heads : 0;
      const int64_t t = t0 + tt;
      float n[S::E], g[S::E];
      load_row<T, VEC, L, S::NC>(x + t * a.x.st + h * a.x.sh, a.x.si, D, ln, active, n);
      load_row<T, VEC, L, S::NC>(gy + t * a.gy.st + h * a.gy.sh, a.gy.si, D, ln, active, g);
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < S::E; ++e) ss += n[e] * n[e];
      ss = group_sum<L>(ss);
      const float rstd = active ? rsqrtf(ss / D + a.eps) : 0.f;  // inactive rows: all zeros, never NaN
      const float* c = tc + tt * R;
      const float* s = ts + tt * R;
#pragma unroll
      for (int e = 0; e < S::E; ++e) {
        const int col = (ln + (e / VEC) * L) * VEC + e % VEC;
        n[e] *= rstd;
        if (col < R) mine[col] = g[e] * s[col];  // u = g·sin, read by the rotation partner
      }
      __syncwarp();
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < S::E; ++e) {
        const int col = (ln + (e / VEC) * L) * VEC + e % VEC;
        if (col >= D) continue;
        float dh = g[e];
        if (col < R) dh = g[e] * c[col] + (col < half ? mine[col + half] : -mine[col - half]);
        acc[e] += dh * n[e];
        g[e] = dh * wsh[col];  // dn
        dot += g[e] * n[e];
      }
      if (dx) {
        dot = group_sum<L>(dot) / D;
#pragma unroll
        for (int e = 0; e < S::E; ++e) g[e] = rstd * (g[e] - n[e] * dot);
        if (active) store_row<T, VEC, L, S::NC>(dx + t * a.dx.st + h * a.dx.sh, a.dx.si, D, ln, g);
      }
      __syncwarp();
    }
    __syncthreads();
  }
  if (a.partial) {  // the block's slots summed in ascending order (the staging rows are free now)
#pragma unroll
    for (int e = 0; e < S::E; ++e) {
      const int col = (ln + (e / VEC) * L) * VEC + e % VEC;
      if (col < D) stage[slot * D + col] = acc[e];
    }
    __syncthreads();
    for (int col = threadIdx.x; col < D; col += blockDim.x) {
      float sum = 0.f;
      for (int p = 0; p < S::P; ++p) sum += stage[p * D + col];
      a.partial[static_cast<int64_t>(blockIdx.x) * D + col] = sum;
    }
  }
}


// ---- The heads-major path (plan::norm_rope_group_lanes): what training runs (bf16/fp16, D 64 or 128).
// A group of L = D/8 lanes owns one item — a token and a run of up to kNormRopeHeadRun of its heads — and
// each lane one 16-byte vector of columns. The token's cos/sin for the lane's columns are made once in
// registers and serve the whole run; the rotation partner (column c ± R/2) sits exactly (R/2)/8 lanes
// away, so it comes by one shuffle; several rows are loaded before any is used, to keep loads in
// flight per thread. No shared memory but the backward's final dweight sum, no block barrier in the loop.
// The arithmetic is the general kernels' in the same order, except cos/sin (fast_sincos below): the
// outputs are 16-bit, where the two agree but for rare last-bit roundings.
namespace heads_major {

// Rows loaded ahead: the forward's whole run of 8 heads, the backward's half of it (two tensors a row).
constexpr int kForwardRows = plan::kNormRopeHeadRun, kBackwardRows = 4;

// cos/sin of an fp32 angle through the SFU: the angle reduced to [-π, π] by a two-constant Cody–Waite
// step (the fma makes x − k·2π_hi exact but for one rounding), then __sincosf, whose error there is
// ~4e-7: ~1e-6 in all against sincosf's correctly-rounded-ish result, far below the bf16/fp16 outputs'
// resolution (this path serves only those), at a fraction of sincosf's ~40 instructions a value.
__device__ __forceinline__ void fast_sincos(float x, float* s, float* c) {
  const float k = rintf(x * 0.159154943091895336f);  // 1 / 2π
  float r = fmaf(-k, 6.28318548202514648f, x);        // 2π rounded to float
  r = fmaf(-k, -1.74845553146951714e-7f, r);          // 2π − float(2π)
  __sincosf(r, s, c);
}

// The lanes of this thread's group, for the shuffles (a group never straddles a warp: L divides 32).
template <int L>
__device__ __forceinline__ unsigned group_mask() {
  if constexpr (L == 32) return 0xffffffffu;
  return ((1u << L) - 1u) << ((threadIdx.x % 32) / L * L);
}

template <int L>
__device__ __forceinline__ float gsum(float v, unsigned mask) {
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off, L);
  return v;
}

// Per-thread constants: the lane's columns, whether they rotate, the partner lane and w'.
template <class T, int L>
struct Lane {
  static constexpr int V = kVec<T>;
  int c0, partner;
  bool rot, first_half;
  float w[V];
  __device__ Lane(const NormRopeArgs& a) {
    const int ln = threadIdx.x % L;
    c0 = ln * V;
    const int half = a.R / 2;
    rot = c0 < a.R;
    first_half = c0 < half;
    partner = first_half ? ln + half / V : ln - half / V;
    const T* wp = static_cast<const T*>(a.w.p);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float v = to_f(wp[(c0 + e) * a.w.s]);
      w[e] = a.weight_offset ? 1.f + v : v;
    }
  }
};

// Rows stay packed (one 16-byte vector, 4 registers) until used: at 8 floats a row the loads in flight
// would cost the occupancy that keeps the memory system busy (148 registers, one block per SM).
template <class T>
__device__ __forceinline__ void unpack(const uint4& u, float* out) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < kVec<T>; ++i) out[i] = to_f(h[i]);
}
__device__ __forceinline__ uint4 load_raw(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// One item's cos/sin for the lane's columns (zeros where it does not rotate).
template <int V>
__device__ __forceinline__ void item_angles(const NormRopeArgs& a, int64_t t, int c0, bool rot, float* c, float* s) {
#pragma unroll
  for (int e = 0; e < V; ++e) c[e] = s[e] = 0.f;
  if (!rot) return;
  if (a.pos.p) {
    const float p = static_cast<float>(static_cast<const int64_t*>(a.pos.p)[t * a.pos.s]);
    const float* f = static_cast<const float*>(a.inv_freq.p);
    const int half = a.R / 2;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      fast_sincos(p * f[static_cast<int64_t>((c0 + e) % half) * a.inv_freq.s], &s[e], &c[e]);  // as HF: fp32 angle
      c[e] *= a.scaling;
      s[e] *= a.scaling;
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      c[e] = load_any(a.cos.p, a.cs_dtype, t * a.cos.ld + (c0 + e) * a.cos.si);
      s[e] = load_any(a.sin.p, a.cs_dtype, t * a.sin.ld + (c0 + e) * a.sin.si);
    }
  }
}

// Blocks a SM the register budget is cut for: the forward's three (85 registers: 8 packed rows), the
// backward's two (128: 4 rows of x and of the gradient, the dweight sums, cos/sin, w' — at 85 it spills).
constexpr int kForwardMinBlocks = 3, kBackwardMinBlocks = 2;

template <class T, int L>
__global__ void __launch_bounds__(plan::kNormRopeThreads, kForwardMinBlocks) fwd(NormRopeArgs a, int64_t items) {
  constexpr int V = kVec<T>;
  const Lane<T, L> lane(a);
  const unsigned mask = group_mask<L>();
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x / L);
  const int runs = (a.heads + plan::kNormRopeHeadRun - 1) / plan::kNormRopeHeadRun;
  const T* x = static_cast<const T*>(a.x.p);
  T* y = static_cast<T*>(a.y.p);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / L) + threadIdx.x / L; item < items;
       item += groups) {
    const int64_t t = item / runs;
    const int h_begin = static_cast<int>(item % runs) * plan::kNormRopeHeadRun;
    const int h_end = min(a.heads, h_begin + plan::kNormRopeHeadRun);
    uint4 raw[kForwardRows];
#pragma unroll
    for (int u = 0; u < kForwardRows; ++u)  // issued first: the angles are computed while they fly
      if (h_begin + u < h_end) raw[u] = load_raw(x + t * a.x.st + (h_begin + u) * a.x.sh + lane.c0);
    float c[V], s[V];
    item_angles<V>(a, t, lane.c0, lane.rot, c, s);
#pragma unroll
    for (int u = 0; u < kForwardRows; ++u) {
      if (h_begin + u >= h_end) break;  // uniform over the group
      float v[V];
      unpack<T>(raw[u], v);
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < V; ++e) ss += v[e] * v[e];
      const float rstd = rsqrtf(gsum<L>(ss, mask) / a.D + a.eps);
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        v[e] = v[e] * rstd * lane.w[e];
        const float p = __shfl_sync(mask, v[e], lane.partner, L);
        o[e] = lane.rot ? v[e] * c[e] + (lane.first_half ? -p : p) * s[e] : v[e];
      }
      store<T, V>(y + t * a.y.st + (h_begin + u) * a.y.sh + lane.c0, o);
    }
  }
}

template <class T, int L>
__global__ void __launch_bounds__(plan::kNormRopeThreads, kBackwardMinBlocks) bwd(NormRopeArgs a, int64_t items) {
  constexpr int V = kVec<T>;
  const Lane<T, L> lane(a);
  const unsigned mask = group_mask<L>();
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x / L);
  const int runs = (a.heads + plan::kNormRopeHeadRun - 1) / plan::kNormRopeHeadRun;
  const T* x = static_cast<const T*>(a.x.p);
  const T* gy = static_cast<const T*>(a.gy.p);
  T* dx = static_cast<T*>(a.dx.p);
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / L) + threadIdx.x / L; item < items;
       item += groups) {
    const int64_t t = item / runs;
    const int h_begin = static_cast<int>(item % runs) * plan::kNormRopeHeadRun;
    const int h_end = min(a.heads, h_begin + plan::kNormRopeHeadRun);
    float c[V], s[V];
    bool have_angles = false;
    for (int h0 = h_begin; h0 < h_end; h0 += kBackwardRows) {
      uint4 rx[kBackwardRows], rg[kBackwardRows];
#pragma unroll
      for (int u = 0; u < kBackwardRows; ++u)
        if (h0 + u < h_end) {
          rx[u] = load_raw(x + t * a.x.st + (h0 + u) * a.x.sh + lane.c0);
          rg[u] = load_raw(gy + t * a.gy.st + (h0 + u) * a.gy.sh + lane.c0);
        }
      if (!have_angles) {  // once the first loads fly
        item_angles<V>(a, t, lane.c0, lane.rot, c, s);
        have_angles = true;
      }
#pragma unroll
      for (int u = 0; u < kBackwardRows; ++u) {
        if (h0 + u >= h_end) break;
        float n[V], g[V];
        unpack<T>(rx[u], n);
        unpack<T>(rg[u], g);
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < V; ++e) ss += n[e] * n[e];
        const float rstd = rsqrtf(gsum<L>(ss, mask) / a.D + a.eps);
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          n[e] *= rstd;
          const float us = lane.rot ? g[e] * s[e] : 0.f;  // u = g·sin, read by the rotation partner
          const float p = __shfl_sync(mask, us, lane.partner, L);
          const float dh = lane.rot ? g[e] * c[e] + (lane.first_half ? p : -p) : g[e];
          acc[e] += dh * n[e];
          g[e] = dh * lane.w[e];  // dn
          dot += g[e] * n[e];
        }
        if (dx) {
          dot = gsum<L>(dot, mask) / a.D;
#pragma unroll
          for (int e = 0; e < V; ++e) g[e] = rstd * (g[e] - n[e] * dot);
          store<T, V>(dx + t * a.dx.st + (h0 + u) * a.dx.sh + lane.c0, g);
        }
      }
    }
  }
  if (a.partial) {  // the block's groups summed in ascending order
    __shared__ float red[plan::kNormRopeThreads / 8][128];
#pragma unroll
    for (int e = 0; e < V; ++e) red[threadIdx.x / L][lane.c0 + e] = acc[e];
    __syncthreads();
    for (int col = threadIdx.x; col < a.D; col += blockDim.x) {
      float sum = 0.f;
      for (int gi = 0; gi < static_cast<int>(blockDim.x) / L; ++gi) sum += red[gi][col];
      a.partial[static_cast<int64_t>(blockIdx.x) * a.D + col] = sum;
    }
  }
}

template <class T>
void launch(const NormRopeArgs& a, bool forward, int lanes, cudaStream_t stream) {
  const int64_t items = plan::norm_rope_items(a.tokens, a.heads);
  const int groups_per_block = plan::kNormRopeThreads / lanes;
  const auto blocks = forward ? static_cast<unsigned>(plan::row_blocks(items, groups_per_block))
                              : static_cast<unsigned>(a.blocks);
  if (lanes == 16) {
    if (forward) fwd<T, 16><<<blocks, plan::kNormRopeThreads, 0, stream>>>(a, items);
    else bwd<T, 16><<<blocks, plan::kNormRopeThreads, 0, stream>>>(a, items);
  } else {
    if (forward) fwd<T, 8><<<blocks, plan::kNormRopeThreads, 0, stream>>>(a, items);
    else bwd<T, 8><<<blocks, plan::kNormRopeThreads, 0, stream>>>(a, items);
  }
}

}  // namespace heads_major

template <class T, int VEC, int L>
void launch(const NormRopeArgs& a, bool forward, cudaStream_t stream) {
  const plan::NormRopeShape sh = plan::norm_rope_shape(a.D, a.heads, VEC);
  const int tpi = sh.tokens_per_iteration;
  const size_t smem = plan::norm_rope_smem_bytes(tpi, a.R, sh.rows_in_parallel, a.D);
  if (forward) {
    const auto blocks = static_cast<unsigned>(plan::row_blocks(a.tokens, tpi));
    norm_rope_fwd<T, VEC, L><<<blocks, plan::kNormRopeThreads, smem, stream>>>(a, tpi);
  } else {
    norm_rope_bwd<T, VEC, L><<<static_cast<unsigned>(a.blocks), plan::kNormRopeThreads, smem, stream>>>(a, tpi);
  }
}

template <class T>
void dispatch(const NormRopeArgs& a, bool forward, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  if constexpr (V == 8) {
    if (const int lanes = plan::norm_rope_group_lanes(a.D, a.R, V, a.vec)) {
      heads_major::launch<T>(a, forward, lanes, stream);
      return;
    }
  }
  const int lanes = plan::norm_rope_lanes(a.D, a.vec ? V : 1);
  if (a.vec) {
    if (lanes == 16)
      launch<T, V, 16>(a, forward, stream);
    else
      launch<T, V, 32>(a, forward, stream);
  } else {
    if (lanes == 16)
      launch<T, 1, 16>(a, forward, stream);
    else
      launch<T, 1, 32>(a, forward, stream);
  }
}

void run(const NormRopeArgs& a, bool forward, cudaStream_t stream) {
  if (a.tokens == 0 || a.heads == 0) return;
  with_element_type(a.dtype, [&](auto zero) { dispatch<decltype(zero)>(a, forward, stream); });
}

}  // namespace

void launch_norm_rope_forward(const NormRopeArgs& a, cudaStream_t stream) { run(a, true, stream); }
void launch_norm_rope_backward(const NormRopeArgs& a, cudaStream_t stream) { run(a, false, stream); }

}  // namespace ax::fused_attn
