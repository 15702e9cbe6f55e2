// Device helpers the nf4 kernels share: the NF4 table and fp32 -> output dtype conversions that round the
// way ATen's .to(dtype) does (round to nearest, ties to even).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include <axengine/cuda/convert.cuh>

#include "kernels.hpp"

namespace ax::nf4 {

// bitsandbytes get_4bit_type("nf4"), as ops::nf4_values().
static __constant__ float kNf4Table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

using ax::cuda::from_f;

__device__ __forceinline__ uint32_t bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint32_t bits16(__half v) { return __half_as_ushort(v); }

// One 16-byte store (p 16-byte aligned). Plain C++ stores of uint4 / float4 come out of nvcc 13 split into
// 4-byte ones here, which costs store throughput; the instruction is spelled out instead.
__device__ __forceinline__ void store16(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

// Calls f(T{}) with T the element type of `dtype`.
template <class F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::fp32: f(float{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
    case DType::fp16: f(__half{}); break;
  }
}

}  // namespace ax::nf4
