// rms_norm forward and backward with the residual add fused (ops/rms_norm.hpp):
//   s = round(x + residual), rstd = rsqrt(mean(s²) + eps) (fp32), y = round(w' · round(s · rstd))
//   dx = grad_sum + rstd·(dn − n·mean(dn·n)),  n = s·rstd, dn = grad_y·w';  dweight = Σ_rows grad_y·round(n)
// A block per row (grid-stride over rows), the row in registers: each thread owns up to NC chunks of VEC
// columns (16-byte vectors, or single elements through any stride). H up to 16384.
// dweight: each thread accumulates its own columns over the rows its block sees (a fixed grid and row
// order) and writes them to partial[block]; launch_reduce_partials sums the blocks in order. No atomics.
#include "../src/plan.hpp"
#include "common.cuh"

namespace ax::fused_attn {
namespace {

using namespace dev;

template <class T, int VEC, int NC, int MAXT>
__global__ void __launch_bounds__(MAXT) rms_fwd(RmsNormArgs a) {
  constexpr int E = NC * VEC;
  __shared__ float scratch[32];
  const T* x = static_cast<const T*>(a.x.p);
  const T* res = static_cast<const T*>(a.residual.p);
  const T* w = static_cast<const T*>(a.w.p);
  T* sum = static_cast<T*>(a.sum.p);
  T* y = static_cast<T*>(a.y.p);
  const int H = static_cast<int>(a.H);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    float s[E];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c0 = (threadIdx.x + k * blockDim.x) * VEC;
      float* v = s + k * VEC;
      if (c0 < H) {
        load<T, VEC>(x + r * a.x.ld + c0 * a.x.si, v);
        if (res) {
          float rv[VEC];
          load<T, VEC>(res + r * a.residual.ld + c0 * a.residual.si, rv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) v[j] = round_to<T>(v[j] + rv[j]);  // the residual stream, as stored
          if (sum) store<T, VEC>(sum + r * a.sum.ld + c0 * a.sum.si, v);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) ss += v[j] * v[j];
    }
    const float rstd = rsqrtf(block_sum(ss, scratch) / H + a.eps);
    if (threadIdx.x == 0) a.rstd[r] = rstd;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c0 = (threadIdx.x + k * blockDim.x) * VEC;
      if (c0 >= H) continue;
      float wv[VEC];
      load<T, VEC>(w + c0 * a.w.s, wv);
      float* v = s + k * VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = (a.weight_offset ? 1.f + wv[j] : wv[j]) * round_to<T>(v[j] * rstd);
      store<T, VEC>(y + r * a.y.ld + c0 * a.y.si, v);
    }
  }
}

template <class T, int VEC, int NC, int MAXT>
__global__ void __launch_bounds__(MAXT) rms_bwd(RmsNormArgs a) {
  constexpr int E = NC * VEC;
  __shared__ float scratch[32];
  const T* sv = static_cast<const T*>(a.sum.p);
  const T* gy = static_cast<const T*>(a.gy.p);
  const T* gs = static_cast<const T*>(a.grad_sum.p);
  const T* w = static_cast<const T*>(a.w.p);
  T* dx = static_cast<T*>(a.dx.p);
  const int H = static_cast<int>(a.H);
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float rstd = a.rstd[r];
    float n[E], g[E];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c0 = (threadIdx.x + k * blockDim.x) * VEC;
      float* nv = n + k * VEC;
      float* gv = g + k * VEC;
      float wv[VEC];  // w' is re-read per row (L1-resident): registers go to the row and the dweight sums
      if (c0 < H) {
        load<T, VEC>(sv + r * a.sum.ld + c0 * a.sum.si, nv);
        load<T, VEC>(gy + r * a.gy.ld + c0 * a.gy.si, gv);
        load<T, VEC>(w + c0 * a.w.s, wv);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) nv[j] = gv[j] = wv[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        nv[j] *= rstd;
        acc[k * VEC + j] += gv[j] * round_to<T>(nv[j]);  // y = w' · round(n): ∂y/∂w = round(n)
        gv[j] *= a.weight_offset ? 1.f + wv[j] : wv[j];   // dn
        dot += gv[j] * nv[j];
      }
    }
    dot = block_sum(dot, scratch) / H;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c0 = (threadIdx.x + k * blockDim.x) * VEC;
      if (c0 >= H) continue;
      float* nv = n + k * VEC;
      float* gv = g + k * VEC;
      float extra[VEC];
      if (gs) load<T, VEC>(gs + r * a.grad_sum.ld + c0 * a.grad_sum.si, extra);
#pragma unroll
      for (int j = 0; j < VEC; ++j) gv[j] = rstd * (gv[j] - nv[j] * dot) + (gs ? extra[j] : 0.f);
      store<T, VEC>(dx + r * a.dx.ld + c0 * a.dx.si, gv);
    }
  }
  if (a.partial) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c0 = (threadIdx.x + k * blockDim.x) * VEC;
      if (c0 >= H) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j) a.partial[static_cast<int64_t>(blockIdx.x) * H + c0 + j] = acc[k * VEC + j];
    }
  }
}

template <class T, int VEC, int NC, int MAXT>
void launch(const RmsNormArgs& a, bool forward, cudaStream_t stream) {
  if (forward) {
    const auto blocks = static_cast<unsigned>(plan::row_blocks(a.rows, 1));
    rms_fwd<T, VEC, NC, MAXT><<<blocks, a.threads, 0, stream>>>(a);
  } else {
    rms_bwd<T, VEC, NC, MAXT><<<static_cast<unsigned>(a.blocks), a.threads, 0, stream>>>(a);
  }
}

template <class T>
void dispatch(const RmsNormArgs& a, bool forward, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  if (a.vec)
    launch<T, V, plan::rms_norm_chunk_cap(V), plan::rms_norm_max_threads(V)>(a, forward, stream);
  else
    launch<T, 1, plan::rms_norm_chunk_cap(1), plan::rms_norm_max_threads(1)>(a, forward, stream);
}

void run(const RmsNormArgs& a, bool forward, cudaStream_t stream) {
  if (a.rows == 0) return;
  with_element_type(a.dtype, [&](auto zero) { dispatch<decltype(zero)>(a, forward, stream); });
}

}  // namespace

void launch_rms_norm_forward(const RmsNormArgs& a, cudaStream_t stream) { run(a, true, stream); }
void launch_rms_norm_backward(const RmsNormArgs& a, cudaStream_t stream) { run(a, false, stream); }

}  // namespace ax::fused_attn
