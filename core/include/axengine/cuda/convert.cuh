// fp32 -> output dtype conversions for the plugins' CUDA kernels that write fp32, bf16 or fp16 (nf4's and fp8's
// dequant kernels): round to nearest, ties to even, as ATen's .to(dtype) does, so a kernel's output equals the
// reference's bit for bit. Header-only device code; plugins include it as <axengine/cuda/convert.cuh> (no plugin
// depends on another).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ax::cuda {

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

}  // namespace ax::cuda
