// swiglu forward and backward (ops/swiglu.hpp), fp32 math, each output rounded once:
//   y = silu(g)·u,  silu(g) = g·σ(g)
//   dgate = dy·u·σ(g)·(1 + g·(1 − σ(g))),  dup = dy·silu(g)
// Memory-bound and elementwise: a 256-thread block is bx threads along a row (16-byte vectors, or single
// elements through any stride) by `by` rows, striding over the rest; no division per element. The gate_up
// form arrives as two views of one buffer (the glue's job), so one kernel serves both input forms.
#include "../src/plan.hpp"
#include "common.cuh"

namespace ax::fused_attn {
namespace {

using namespace dev;

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

template <class T, int VEC>
__global__ void __launch_bounds__(256) swiglu_fwd(SwigluArgs a, int64_t vectors) {
  const T* gate = static_cast<const T*>(a.gate.p);
  const T* up = static_cast<const T*>(a.up.p);
  T* y = static_cast<T*>(a.y.p);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < a.rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    for (int64_t c = threadIdx.x; c < vectors; c += blockDim.x) {
      const int64_t i = c * VEC;
      float g[VEC], u[VEC];
      load<T, VEC>(gate + r * a.gate.ld + i * a.gate.si, g);
      load<T, VEC>(up + r * a.up.ld + i * a.up.si, u);
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[j] = g[j] * sigmoid(g[j]) * u[j];
      store<T, VEC>(y + r * a.y.ld + i * a.y.si, g);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(256) swiglu_bwd(SwigluArgs a, int64_t vectors) {
  const T* gate = static_cast<const T*>(a.gate.p);
  const T* up = static_cast<const T*>(a.up.p);
  const T* gy = static_cast<const T*>(a.gy.p);
  T* dgate = static_cast<T*>(a.dgate.p);
  T* dup = static_cast<T*>(a.dup.p);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < a.rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    for (int64_t c = threadIdx.x; c < vectors; c += blockDim.x) {
      const int64_t i = c * VEC;
      float g[VEC], u[VEC], d[VEC];
      load<T, VEC>(gate + r * a.gate.ld + i * a.gate.si, g);
      load<T, VEC>(up + r * a.up.ld + i * a.up.si, u);
      load<T, VEC>(gy + r * a.gy.ld + i * a.gy.si, d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float sg = sigmoid(g[j]);
        const float silu = g[j] * sg;
        const float dg = d[j] * u[j] * sg * (1.f + g[j] * (1.f - sg));
        u[j] = d[j] * silu;  // dup
        g[j] = dg;
      }
      store<T, VEC>(dgate + r * a.dgate.ld + i * a.dgate.si, g);
      store<T, VEC>(dup + r * a.dup.ld + i * a.dup.si, u);
    }
  }
}

template <class T>
void dispatch(const SwigluArgs& a, bool forward, cudaStream_t stream) {
  constexpr int V = kVec<T>;
  const int vec = a.vec ? V : 1;
  const int64_t vectors = (a.I + vec - 1) / vec;  // exact when vectorised (I % V == 0)
  const plan::Tile tile = plan::swiglu_tile(vectors);
  const dim3 block(tile.bx, tile.by);
  const auto blocks = static_cast<unsigned>(plan::row_blocks(a.rows, tile.by));
  if (a.vec) {
    if (forward)
      swiglu_fwd<T, V><<<blocks, block, 0, stream>>>(a, vectors);
    else
      swiglu_bwd<T, V><<<blocks, block, 0, stream>>>(a, vectors);
  } else {
    if (forward)
      swiglu_fwd<T, 1><<<blocks, block, 0, stream>>>(a, vectors);
    else
      swiglu_bwd<T, 1><<<blocks, block, 0, stream>>>(a, vectors);
  }
}

void run(const SwigluArgs& a, bool forward, cudaStream_t stream) {
  if (a.rows == 0 || a.I == 0) return;
  with_element_type(a.dtype, [&](auto zero) { dispatch<decltype(zero)>(a, forward, stream); });
}

}  // namespace

void launch_swiglu_forward(const SwigluArgs& a, cudaStream_t stream) { run(a, true, stream); }
void launch_swiglu_backward(const SwigluArgs& a, cudaStream_t stream) { run(a, false, stream); }

}  // namespace ax::fused_attn
