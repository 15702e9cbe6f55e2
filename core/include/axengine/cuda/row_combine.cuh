// The gated combine of a MoE block, shared by the plugins' CUDA code (scattermoe's kernels/gates.cu,
// sonicmoe's kernels/combine.cu): y[t] = Σ_j g[t, j] · rows[row_of[t·k + j]] (gates null: the plain k-sum of
// dX), reading the expert rows through the inverse of the routing permutation (row_of < 0: an inactive
// entry, which contributes nothing). Memory-bound: a warp per token, each lane moving 16-byte vectors and
// accumulating in fp32 in a fixed order (j ascending), so the result is deterministic. As an index_select,
// a mask and a batched [1, k] x [k, N] GEMM it moved each row three times more. Header-only device code;
// plugins include it as <axengine/cuda/row_combine.cuh> (no plugin depends on another).
#pragma once
#include <cstdint>

namespace ax::cuda {

constexpr int kMaxTopK = 16;

template <class T>
__device__ __forceinline__ void load8(const T* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(h[i]);
}
template <class T>
__device__ __forceinline__ void store8(T* p, const float* v) {
  uint4 u;
  T* h = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = static_cast<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

// N, ld_rows, ld_y: multiples of 8; rows, y: 16-byte aligned; k <= kMaxTopK; T·k < 2^31 (row indices are
// held as 32 bits: the k rows of a token stay in registers).
struct RowCombine {
  int64_t T = 0;
  int k = 0, N = 0;
  const void* rows = nullptr;
  int64_t ld_rows = 0;
  const int64_t* row_of = nullptr;  // [T·k]; null: entry s is row s
  const void* gates = nullptr;      // [T, k], T's type; null: weight 1
  void* y = nullptr;
  int64_t ld_y = 0;
};

// Launch with 256 threads (8 warps, a token per warp), any grid (warps stride over the tokens).
template <class T>
__global__ void __launch_bounds__(256, 4) combine_rows_kernel(RowCombine a) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const T* rows = static_cast<const T*>(a.rows);
  const T* g = static_cast<const T*>(a.gates);
  T* y = static_cast<T*>(a.y);
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; t < a.T; t += warps) {
    int r[kMaxTopK];
    float gj[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      r[j] = j < a.k ? static_cast<int>(a.row_of ? a.row_of[t * a.k + j] : t * a.k + j) : -1;
      gj[j] = (r[j] >= 0 && g) ? static_cast<float>(g[t * a.k + j]) : 1.f;
    }
    for (int64_t c = lane * 8; c < a.N; c += 32 * 8) {
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, v[8];
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (r[j] < 0) continue;
        load8(rows + static_cast<int64_t>(r[j]) * a.ld_rows + c, v);
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[q] += gj[j] * v[q];
      }
      store8(y + t * a.ld_y + c, acc);
    }
  }
}

}  // namespace ax::cuda
