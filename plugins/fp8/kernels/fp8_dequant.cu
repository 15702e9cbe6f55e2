// fp8 (e4m3fn) + block scales -> fp32/bf16/fp16 (fp8_dequant.hpp). Memory-bound: each thread decodes items of 8
// consecutive elements of a row (one 8-byte load, one 16-byte store in bf16/fp16, two in fp32), consecutive
// lanes on consecutive items, so a warp's load covers 256 contiguous bytes. When block_cols is a multiple of 8 an
// item lies in one scale block (one scale load); otherwise each element finds its own. Rows whose length is not
// a multiple of 8, or pointers that do not allow the vector accesses, take an element-by-element path with the
// same math. e4m3 -> half is exact (every e4m3 value is a half), half -> float too; the product is one
// __fmul_rn, the store one rounding: ops::dequantize's arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <axengine/cuda/convert.cuh>

#include "fp8_dequant.hpp"

namespace ax::fp8 {
namespace {

constexpr int kGroup = 8;
constexpr int kThreads = 256;

__device__ __forceinline__ float e4m3(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
}

using ax::cuda::from_f;

template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  T lo = from_f<T>(a), hi = from_f<T>(b);
  return uint32_t(*reinterpret_cast<const uint16_t*>(&lo)) | (uint32_t(*reinterpret_cast<const uint16_t*>(&hi)) << 16);
}

template <class T>
__global__ void __launch_bounds__(kThreads) fp8_dequant_kernel(Fp8DequantLaunch p, bool vec) {
  const int64_t R = p.rows, C = p.cols, per = R * C;
  const int64_t Cb = (C + p.block_cols - 1) / p.block_cols, sper = ((R + p.block_rows - 1) / p.block_rows) * Cb;
  const bool one_scale = p.block_cols % kGroup == 0;
  const int64_t items = vec ? per / kGroup : per;  // vec: C % 8 == 0, so an item never crosses a row
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t s = blockIdx.y; s < p.slices; s += gridDim.y) {
    const int64_t src = p.experts != nullptr ? p.experts[s] : s;
    const uint8_t* codes = p.codes + src * per;
    const float* scales = p.scales + src * sper;
    T* out = static_cast<T*>(p.out) + s * per;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < items; i += stride) {
      if (!vec) {
        const int64_t r = i / C, c = i % C;
        out[i] = from_f<T>(__fmul_rn(e4m3(codes[i]), scales[(r / p.block_rows) * Cb + c / p.block_cols]));
        continue;
      }
      const int64_t e0 = i * kGroup, r = e0 / C, c0 = e0 % C;
      const uint2 word = *reinterpret_cast<const uint2*>(codes + e0);
      const float* srow = scales + (r / p.block_rows) * Cb;
      float v[kGroup];
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const uint8_t b = uint8_t(((k < 4 ? word.x : word.y) >> (8 * (k % 4))) & 0xFFu);  // little-endian
        const float sc = one_scale ? srow[c0 / p.block_cols] : srow[(c0 + k) / p.block_cols];
        v[k] = __fmul_rn(e4m3(b), sc);
      }
      if constexpr (sizeof(T) == 4) {
        reinterpret_cast<float4*>(out + e0)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(out + e0)[1] = make_float4(v[4], v[5], v[6], v[7]);
      } else {
        *reinterpret_cast<uint4*>(out + e0) = make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]),
                                                         pack2<T>(v[6], v[7]));
      }
    }
  }
}

}  // namespace

void launch_fp8_dequant(const Fp8DequantLaunch& p, cudaStream_t stream) {
  const int64_t per = p.rows * p.cols;
  if (per == 0 || p.slices == 0) return;
  const size_t out_bytes = p.dtype == DType::fp32 ? 4 : 2;
  // 8-byte code loads and 16-byte stores: whole rows of 8 and aligned bases (every slice starts at a multiple
  // of 8 elements then).
  const bool vec = p.cols % kGroup == 0 && reinterpret_cast<uintptr_t>(p.codes) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(p.out) % (kGroup * out_bytes) == 0;
  const int64_t items = vec ? per / kGroup : per;
  const int64_t bx = (items + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(bx < 65535 ? bx : 65535), static_cast<unsigned>(p.slices < 65535 ? p.slices : 65535));
  switch (p.dtype) {
    case DType::fp32: fp8_dequant_kernel<float><<<grid, kThreads, 0, stream>>>(p, vec); break;
    case DType::bf16: fp8_dequant_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p, vec); break;
    case DType::fp16: fp8_dequant_kernel<__half><<<grid, kThreads, 0, stream>>>(p, vec); break;
  }
}

}  // namespace ax::fp8
