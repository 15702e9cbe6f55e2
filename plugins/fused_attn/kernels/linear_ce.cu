// linear_ce's row kernels (ops/linear_ce.hpp); the GEMMs around them are cuBLAS through at::mm (glue).
// Forward, per chunk of logits [rows, V] in the compute dtype: a block per row reads it once with an
// online softmax (each thread a running max m and Σ exp(x − m) in fp32, rescaled when m grows — once per
// 16-byte vector, not per element), then the block combines the (m, s) pairs by a fixed butterfly and the
// warps in ascending order: lse = m + log s, loss = lse − logit[target] (0 at ignore_index; NaN for a
// target outside [0, V), which only an unchecked call can pass). With unit_grad the block then rewrites
// the row in place with g = exp(logit − lse) − [v == target] (grad_in_forward: the glue multiplies it by W
// into the saved unit gradient), so the logits are read twice and written once, as forward + backward
// kernels did, but their GEMM runs once.
// Backward, in place: g = grad_loss[t]·(exp(logit − lse[t]) − [v == target[t]]) in the compute dtype,
// rows at ignore_index all zero; the glue then multiplies g by W.
// Scale (backward from the saved unit gradient): dh = round(grad_loss[t] · unit[t]), one pass.
#include <cmath>

#include "common.cuh"

namespace ax::fused_attn {
namespace {

using namespace dev;

constexpr int kThreads = 512;

struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};  // both empty: exp(-inf - -inf) would be NaN
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Row `row` of logits in place → scale · (exp(logit − L) − [v == tgt]), all zero when `ignored`. The
// forward's unit gradient passes scale = 1 (1 · x == x: the backward's formula, bit for bit, at
// grad_loss = 1).
template <class T, int VEC>
__device__ __forceinline__ void gradient_row(T* row, int64_t vectors, int64_t si, float L, int64_t tgt,
                                             bool ignored, float scale) {
  for (int64_t c = threadIdx.x; c < vectors; c += kThreads) {
    float v[VEC];
    T* p = row + c * VEC * si;
    load<T, VEC>(p, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t idx = c * VEC + j;
      v[j] = ignored ? 0.f : scale * (expf(v[j] - L) - (idx == tgt ? 1.f : 0.f));
    }
    store<T, VEC>(p, v);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) ce_fwd(CeArgs a, int64_t vectors) {
  __shared__ MaxSum warps[kThreads / 32];
  __shared__ float row_lse;
  T* logits = static_cast<T*>(a.logits.p);
  const int64_t* targets = static_cast<const int64_t*>(a.targets.p);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    T* row = logits + r * a.logits.ld;
    MaxSum acc{-INFINITY, 0.f};
    for (int64_t c = threadIdx.x; c < vectors; c += kThreads) {
      float v[VEC];
      load<T, VEC>(row + c * VEC * a.logits.si, v);
      float mv = v[0];
#pragma unroll
      for (int j = 1; j < VEC; ++j) mv = fmaxf(mv, v[j]);
      if (mv > acc.m) {
        acc.s *= expf(acc.m - mv);
        acc.m = mv;
      }
      if (acc.m > -INFINITY) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc.s += expf(v[j] - acc.m);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const MaxSum o{__shfl_xor_sync(0xffffffffu, acc.m, off), __shfl_xor_sync(0xffffffffu, acc.s, off)};
      acc = combine(acc, o);
    }
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      MaxSum all = warps[0];
      for (int w = 1; w < kThreads / 32; ++w) all = combine(all, warps[w]);
      const float lse = all.m + logf(all.s);
      const int64_t t = a.t0 + r;
      const int64_t tgt = targets[t * a.targets.s];
      float loss = 0.f;
      if (tgt != a.ignore_index)
        loss = (tgt >= 0 && tgt < a.V) ? lse - to_f(row[tgt * a.logits.si]) : __int_as_float(0x7fc00000);
      a.lse[t] = lse;
      a.loss[t] = loss;
      row_lse = lse;
    }
    // `warps` is rewritten by the next row; row_lse is read below; thread 0 has read row[tgt] before any
    // thread rewrites the row.
    __syncthreads();
    if (a.unit_grad) {
      const int64_t tgt = targets[(a.t0 + r) * a.targets.s];
      // row_lse is rewritten only after the next row's first barrier, which every thread reaches after this read.
      gradient_row<T, VEC>(row, vectors, a.logits.si, row_lse, tgt, tgt == a.ignore_index, 1.f);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads) ce_bwd(CeArgs a, int64_t vectors) {
  T* logits = static_cast<T*>(a.logits.p);
  const int64_t* targets = static_cast<const int64_t*>(a.targets.p);
  const float* lse = static_cast<const float*>(a.lse_in.p);
  const float* grad = static_cast<const float*>(a.grad_loss.p);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t t = a.t0 + r;
    const int64_t tgt = targets[t * a.targets.s];
    const bool ignored = tgt == a.ignore_index;
    const float gl = grad[t * a.grad_loss.s], L = lse[t * a.lse_in.s];
    gradient_row<T, VEC>(logits + r * a.logits.ld, vectors, a.logits.si, L, tgt, ignored, gl);
  }
}

constexpr int kScaleThreads = 256;

template <class T, int VEC>
__global__ void __launch_bounds__(kScaleThreads) ce_scale(CeScaleArgs a, int64_t vectors) {
  const T* unit = static_cast<const T*>(a.unit.p);
  T* dh = static_cast<T*>(a.dh.p);
  const int64_t* targets = static_cast<const int64_t*>(a.targets.p);
  const float* grad = static_cast<const float*>(a.grad_loss.p);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    // Ignored rows are written as zeros, not scaled: exact 0 whatever grad_loss holds there (as the
    // recomputing backward, which drops their grad_loss).
    const bool ignored = targets[r * a.targets.s] == a.ignore_index;
    const float gl = ignored ? 0.f : grad[r * a.grad_loss.s];
    const T* in = unit + r * a.unit.ld;
    T* out = dh + r * a.dh.ld;
    for (int64_t c = threadIdx.x; c < vectors; c += kScaleThreads) {
      float v[VEC];
      load<T, VEC>(in + c * VEC * a.unit.si, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = ignored ? 0.f : gl * v[j];
      store<T, VEC>(out + c * VEC * a.dh.si, v);
    }
  }
}

template <class T>
void dispatch(const CeArgs& a, bool forward, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  const auto blocks = static_cast<unsigned>(a.rows < (1 << 20) ? a.rows : (1 << 20));
  if (a.vec) {
    const int64_t vectors = a.V / V;  // the glue vectorises only when V % V_width == 0
    if (forward)
      ce_fwd<T, V><<<blocks, kThreads, 0, stream>>>(a, vectors);
    else
      ce_bwd<T, V><<<blocks, kThreads, 0, stream>>>(a, vectors);
  } else {
    if (forward)
      ce_fwd<T, 1><<<blocks, kThreads, 0, stream>>>(a, a.V);
    else
      ce_bwd<T, 1><<<blocks, kThreads, 0, stream>>>(a, a.V);
  }
}

void run(const CeArgs& a, bool forward, cudaStream_t stream) {
  if (a.rows == 0) return;
  with_element_type(a.dtype, [&](auto zero) { dispatch<decltype(zero)>(a, forward, stream); });
}

}  // namespace

void launch_ce_forward(const CeArgs& a, cudaStream_t stream) { run(a, true, stream); }
void launch_ce_backward(const CeArgs& a, cudaStream_t stream) { run(a, false, stream); }

void launch_ce_scale(const CeScaleArgs& a, cudaStream_t stream) {
  if (a.rows == 0 || a.H == 0) return;
  const auto blocks = static_cast<unsigned>(a.rows < (1 << 20) ? a.rows : (1 << 20));
  auto go = [&](auto zero) {
    using T = decltype(zero);
    if (a.vec)
      ce_scale<T, kVec<T>><<<blocks, kScaleThreads, 0, stream>>>(a, a.H / kVec<T>);
    else
      ce_scale<T, 1><<<blocks, kScaleThreads, 0, stream>>>(a, a.H);
  };
  with_element_type(a.dtype, go);
}

}  // namespace ax::fused_attn
