// Passes between token order and the expert rows (moe_gemm.hpp): the gates combine
// y[t] = Σ_j g[t, j] · rows[row_of(t·k + j)] (also the k-sum of dX, without gates), its gradient
// dg[t, j] = dY[t] · rows[row_of(t·k + j)], the gather g · dY into sorted order, and the inverse of the
// routing permutation these read through. All are memory-bound: each thread moves 16-byte vectors and
// accumulates in fp32 in a fixed order (j ascending; warp sums by a fixed butterfly), so results are
// deterministic. As batched [1, k] x [k, N] GEMMs (cuBLAS gemv) the combine ran at ~0.8 TB/s.
//
// Reading the expert rows in sorted order through the inverse permutation (rather than having the
// GEMMs scatter them) saves zero-filling an [M, N] buffer and lets the split path add LoRA in place.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>

#include <axengine/cuda/row_combine.cuh>

#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
namespace {

using ax::cuda::kMaxTopK;
using ax::cuda::load8;
using ax::cuda::store8;

// Row of `rows` holding scattered entry s, or -1 (inactive: contributes nothing). 32 bits: the launchers
// require T·k < 2^31, and the k rows of a token stay in registers (int64 doubled their cost and capped
// the kernels at ~24 warps per SM).
__device__ __forceinline__ int row_of(const GatesArgs& a, int64_t s) {
  return static_cast<int>(a.row_of ? a.row_of[s] : s);
}

// Warps walk tokens (combine) or sorted rows (gather); each lane moves 8-column chunks of the row, so the
// row indices are read once per row and no thread divides.
__device__ __forceinline__ int64_t warp_id() { return blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; }
__device__ __forceinline__ int64_t warp_count() { return static_cast<int64_t>(gridDim.x) * (blockDim.x / 32); }

// One warp per token: each lane walks its 8-column chunks, k partial dot products, then warp sums.
template <class T>
__global__ void __launch_bounds__(256, 4) dgates_kernel(GatesArgs a) {
  const int lane = threadIdx.x % 32;
  const T* rows = static_cast<const T*>(a.rows);
  const T* dy = static_cast<const T*>(a.y);
  T* dg = static_cast<T*>(a.gates);
  for (int64_t t = warp_id(); t < a.T; t += warp_count()) {
    float acc[kMaxTopK];
    int r[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      acc[j] = 0.f;
      r[j] = j < a.k ? row_of(a, t * a.k + j) : -1;
    }
    for (int64_t c = lane * 8; c < a.N; c += 32 * 8) {
      float d[8], v[8];
      load8(dy + t * a.ld_y + c, d);
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (r[j] < 0) continue;
        load8(rows + static_cast<int64_t>(r[j]) * a.ld_rows + c, v);
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

template <class T>
__global__ void gather_rows_kernel(GatherArgs a) {
  const int lane = threadIdx.x % 32;
  const T* src = static_cast<const T*>(a.src);
  const T* scale = static_cast<const T*>(a.scale);
  T* out = static_cast<T*>(a.out);
  for (int64_t m = warp_id(); m < a.M; m += warp_count()) {
    const bool active = a.row_expert[m] >= 0;
    const int64_t s = active ? a.idx[m] : 0;
    const T* row = src + (s / a.div) * a.ld_src;
    const float f = (active && scale) ? static_cast<float>(scale[s]) : 1.f;
#pragma unroll 4
    for (int64_t c = lane * 8; c < a.N; c += 32 * 8) {
      float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (active) {
        load8(row + c, v);
#pragma unroll
        for (int q = 0; q < 8; ++q) v[q] *= f;
      }
      store8(out + m * a.ld_out + c, v);
    }
  }
}

__global__ void inverse_rows_kernel(const int64_t* row_expert, const int64_t* scattered, int64_t M, int64_t* inv) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < M;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (row_expert[p] >= 0) inv[scattered[p]] = p;
}

bool vectorisable(int64_t N, std::initializer_list<int64_t> lds, std::initializer_list<const void*> ptrs) {
  if (N % 8 != 0) return false;
  for (int64_t ld : lds)
    if (ld % 8 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

unsigned blocks_for(int64_t work, int per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace
}  // namespace detail

bool launch_gates_combine(const GatesArgs& a, cudaStream_t stream) {
  if (!detail::vectorisable(a.N, {a.ld_rows, a.ld_y}, {a.rows, a.y}) || a.k > detail::kMaxTopK) return false;
  if (a.T * a.k > 0x7fffffff) return false;
  if (a.T == 0 || a.N == 0) return true;
  const unsigned blocks = detail::blocks_for(a.T, 8);  // 8 warps of 32 per block, a token per warp
  const ax::cuda::RowCombine c{a.T, a.k, a.N, a.rows, a.ld_rows, a.row_of, a.gates, a.y, a.ld_y};
  if (a.dtype == DType::bf16) ax::cuda::combine_rows_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(c);
  else ax::cuda::combine_rows_kernel<__half><<<blocks, 256, 0, stream>>>(c);
  return true;
}

bool launch_gates_grad(const GatesArgs& a, cudaStream_t stream) {
  if (!detail::vectorisable(a.N, {a.ld_rows, a.ld_y}, {a.rows, a.y}) || a.k > detail::kMaxTopK) return false;
  if (a.T * a.k > 0x7fffffff) return false;
  if (a.T == 0) return true;
  const unsigned blocks = detail::blocks_for(a.T, 8);  // 8 warps of 32 per block, a token per warp
  if (a.dtype == DType::bf16) detail::dgates_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(a);
  else detail::dgates_kernel<__half><<<blocks, 256, 0, stream>>>(a);
  return true;
}

bool launch_gather_rows(const GatherArgs& a, cudaStream_t stream) {
  if (!detail::vectorisable(a.N, {a.ld_src, a.ld_out}, {a.src, a.out})) return false;
  if (a.M == 0 || a.N == 0) return true;
  const unsigned blocks = detail::blocks_for(a.M, 8);
  if (a.dtype == DType::bf16) detail::gather_rows_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(a);
  else detail::gather_rows_kernel<__half><<<blocks, 256, 0, stream>>>(a);
  return true;
}

void launch_inverse_rows(const int64_t* row_expert, const int64_t* scattered, int64_t M, int64_t* inv,
                         cudaStream_t stream) {
  if (M == 0) return;
  cudaMemsetAsync(inv, 0xff, M * sizeof(int64_t), stream);  // all bytes 0xff: -1 in every entry
  detail::inverse_rows_kernel<<<detail::blocks_for(M, 256), 256, 0, stream>>>(row_expert, scattered, M, inv);
}

}  // namespace ax::scattermoe
