// Device helpers shared by the fused_attn kernels: element conversions, chunk loads and stores (a 16-byte
// vector, or one element through a stride), and fixed-order reductions (warp butterflies, then warps in
// ascending order) so that every result is bitwise reproducible.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels.hpp"

namespace ax::fused_attn {

// Calls f with a value of the element type `dt` names (host side: picks the kernel instantiation), e.g.
//   with_element_type(a.dtype, [&](auto zero) { launch<decltype(zero)>(a, stream); });
template <class F>
void with_element_type(DType dt, F&& f) {
  switch (dt) {
    case DType::bf16:
      f(__nv_bfloat16{});
      break;
    case DType::fp16:
      f(__half{});
      break;
    case DType::fp32:
      f(0.f);
      break;
  }
}

namespace dev {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}

// v rounded to T and back: the value a tensor of dtype T holds.
template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_f(from_f<T>(v));
}

template <class T>
constexpr int kVec = 16 / sizeof(T);

// N consecutive elements (N = 16 bytes / sizeof(T): one aligned vector; N = 1: one element, any
// address) as floats.
template <class T, int N>
__device__ __forceinline__ void load(const T* p, float* out) {
  if constexpr (N == 1) {
    out[0] = to_f(*p);
  } else {
    static_assert(N * sizeof(T) == 16, "a vector chunk is 16 bytes");
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f(h[i]);
  }
}
template <class T, int N>
__device__ __forceinline__ void store(T* p, const float* v) {
  if constexpr (N == 1) {
    *p = from_f<T>(v[0]);
  } else {
    uint4 u;
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = from_f<T>(v[i]);
    *reinterpret_cast<uint4*>(p) = u;
  }
}

// An element of runtime dtype `dt` (cos/sin may be another compute dtype than x).
__device__ __forceinline__ float load_any(const void* p, DType dt, int64_t off) {
  switch (dt) {
    case DType::bf16:
      return to_f(static_cast<const __nv_bfloat16*>(p)[off]);
    case DType::fp16:
      return to_f(static_cast<const __half*>(p)[off]);
    default:
      return static_cast<const float*>(p)[off];
  }
}

// Sum over groups of `width` consecutive lanes (a power of two <= 32) by a fixed butterfly; every lane of
// the group gets the same total. All 32 lanes of the warp must call it.
template <int width>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = width / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): warp butterflies, then the warp sums in
// ascending order; every thread gets the same total. `scratch` holds 32 floats; the trailing barrier lets
// the caller reuse it at once.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = group_sum<32>(v);
  const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < nwarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

}  // namespace dev
}  // namespace ax::fused_attn
