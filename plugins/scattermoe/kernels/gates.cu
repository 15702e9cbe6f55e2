// The gates of the top-k outputs (moe_gemm.hpp): combine y[t] = Σ_j g[t, j] · rows[t·k + j] and its
// gradient dg[t, j] = dY[t] · rows[t·k + j]. Both are memory-bound passes over the [T·k, N] expert rows;
// as batched [1, k] x [k, N] GEMMs (cuBLAS gemv) they ran at ~0.8 TB/s. Here each thread moves 16-byte
// vectors and accumulates in fp32 in a fixed order (j ascending; warp sums by a fixed butterfly), so
// results are deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
namespace {

constexpr int kMaxTopK = 16;

template <class T>
__device__ __forceinline__ void load8(const T* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(h[i]);
}

template <class T>
__global__ void combine_kernel(GatesArgs a) {
  const int64_t chunks = a.N / 8;
  const T* rows = static_cast<const T*>(a.rows);
  const T* g = static_cast<const T*>(a.gates);
  T* y = static_cast<T*>(a.y);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.T * chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / chunks, c = (i % chunks) * 8;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, v[8];
    for (int j = 0; j < a.k; ++j) {
      const float gj = static_cast<float>(g[t * a.k + j]);
      load8(rows + (t * a.k + j) * a.ld_rows + c, v);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += gj * v[q];
    }
    uint4 u;
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int q = 0; q < 8; ++q) h[q] = static_cast<T>(acc[q]);
    *reinterpret_cast<uint4*>(y + t * a.ld_y + c) = u;
  }
}

// One warp per token: each lane walks its 8-column chunks, k partial dot products, then warp sums.
template <class T>
__global__ void dgates_kernel(GatesArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const T* rows = static_cast<const T*>(a.rows);
  const T* dy = static_cast<const T*>(a.y);
  T* dg = static_cast<T*>(a.gates);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; t < a.T; t += warps) {
    float acc[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) acc[j] = 0.f;
    for (int64_t c = lane * 8; c < a.N; c += 32 * 8) {
      float d[8], v[8];
      load8(dy + t * a.ld_y + c, d);
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j >= a.k) break;
        load8(rows + (t * a.k + j) * a.ld_rows + c, v);
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[j] += d[q] * v[q];
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      if (j >= a.k) break;
      float s = acc[j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) dg[t * a.k + j] = static_cast<T>(s);
    }
  }
}

bool vectorisable(const GatesArgs& a) {
  return a.N % 8 == 0 && a.ld_rows % 8 == 0 && a.ld_y % 8 == 0 && aligned16(a.rows) && aligned16(a.y);
}

unsigned blocks_for(int64_t work, int per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace
}  // namespace detail

bool launch_gates_combine(const GatesArgs& a, cudaStream_t stream) {
  if (!detail::vectorisable(a)) return false;
  if (a.T == 0 || a.N == 0) return true;
  const unsigned blocks = detail::blocks_for(a.T * (a.N / 8), 256);
  if (a.dtype == DType::bf16) detail::combine_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(a);
  else detail::combine_kernel<__half><<<blocks, 256, 0, stream>>>(a);
  return true;
}

bool launch_gates_grad(const GatesArgs& a, cudaStream_t stream) {
  if (!detail::vectorisable(a) || a.k > detail::kMaxTopK) return false;
  if (a.T == 0) return true;
  const unsigned blocks = detail::blocks_for(a.T, 8);  // 8 warps of 32 per block, a token per warp
  if (a.dtype == DType::bf16) detail::dgates_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(a);
  else detail::dgates_kernel<__half><<<blocks, 256, 0, stream>>>(a);
  return true;
}

}  // namespace ax::scattermoe
