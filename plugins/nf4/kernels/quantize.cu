// x -> nf4 (kernels.hpp, QuantizeNf4Launch / QuantizeAbsmaxLaunch): core's blockwise_nearest op for op.
// Every fp32 step is the IEEE-rounded one ATen's CUDA kernels perform (no fast math, no contraction), and
// the order of a max does not change its value, so codes and scales equal the reference's bit for bit.
//
// Stage 1: each thread loads 8 consecutive values (one or two 16-byte loads); a block's bs/8 threads
// reduce its absmax with warp shuffles (and, for bs > 256, through shared memory: one block of bs/8
// threads per quantisation block), then each thread finds its 8 codes against the 15 midpoints (in
// registers) and stores 4 packed bytes. Stage 2 (double quant): one thread block of 256 per block of 256
// absmax values, the 255 midpoints of the dynamic map in shared memory, ATen's bucketize binary search.
#include "common.cuh"

namespace ax::nf4 {
namespace {

constexpr int kPer = 8;  // values per thread in stage 1

// at::max / clamp_min / clamp propagate NaN.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// blockwise_nearest's scale: reciprocal(clamp_min(absmax, 1e-38)).
__device__ __forceinline__ float inv_scale(float absmax) {
  const float m = absmax != absmax ? absmax : fmaxf(absmax, 1e-38f);
  return __fdiv_rn(1.0f, m);
}
__device__ __forceinline__ float clamp_unit(float v) { return v != v ? v : fminf(fmaxf(v, -1.0f), 1.0f); }

template <class T>
__device__ __forceinline__ void load8(const T* x, int64_t i, float (&v)[kPer]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(x + i)[0], b = reinterpret_cast<const float4*>(x + i)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    struct alignas(16) Raw {
      T e[kPer];
    };
    const Raw r = *reinterpret_cast<const Raw*>(x + i);
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = to_f(r.e[k]);
  }
}

// kGroup threads (bs / 8) share a block; kGroup <= 32: several blocks per warp, else one per thread block.
template <class T, int kGroup>
__global__ void quantize_nf4_kernel(QuantizeNf4Launch p) {
  constexpr int kThreads = kGroup > 256 ? kGroup : 256;
  __shared__ float partial[kThreads / 32];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool valid = t * kPer < p.n;  // n is a multiple of the block, so a block is all valid or all not
  float v[kPer];
  float m = 0.0f;
  if (valid) {
    load8(static_cast<const T*>(p.x), t * kPer, v);
#pragma unroll
    for (int k = 0; k < kPer; ++k) m = nan_max(fabsf(v[k]), m);
  }
#pragma unroll
  for (int off = (kGroup < 32 ? kGroup : 32) / 2; off > 0; off /= 2) m = nan_max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if constexpr (kGroup > 32) {
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = m;
    __syncthreads();
    m = partial[0];
#pragma unroll
    for (int w = 1; w < kGroup / 32; ++w) m = nan_max(m, partial[w]);
  }
  if (!valid) return;
  if (threadIdx.x % kGroup == 0) p.absmax[(t * kPer) >> p.log2_blocksize] = m;
  const float r = inv_scale(m);
  uint32_t packed = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const float s = clamp_unit(__fmul_rn(v[k], r));
    uint32_t c = 0;
#pragma unroll
    for (int j = 0; j < 15; ++j) c += !(p.bounds[j] >= s) ? 1u : 0u;
    // first element of each pair in the high nibble; byte k/2 of the little-endian word
    packed |= c << (8 * (k / 2) + ((k & 1) ? 0 : 4));
  }
  reinterpret_cast<uint32_t*>(p.codes)[t] = packed;
}

__global__ void __launch_bounds__(256) quantize_absmax_kernel(QuantizeAbsmaxLaunch p) {
  __shared__ float bounds[255];
  __shared__ float partial[8];
  if (threadIdx.x < 255) bounds[threadIdx.x] = p.bounds[threadIdx.x];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  const bool valid = i < p.n;
  const float v = valid ? __fsub_rn(p.absmax[i], *p.offset) : 0.0f;  // absmax - mean(absmax)
  float m = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = nan_max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = m;
  __syncthreads();
  m = partial[0];
#pragma unroll
  for (int w = 1; w < 8; ++w) m = nan_max(m, partial[w]);
  if (threadIdx.x == 0) p.nested_absmax[blockIdx.x] = m;
  if (!valid) return;
  const float s = clamp_unit(__fmul_rn(v, inv_scale(m)));
  // torch.bucketize (right=False): ATen's lower-bound loop, verbatim.
  int start = 0, end = 255;
  while (start < end) {
    const int mid = start + ((end - start) >> 1);
    if (!(bounds[mid] >= s)) start = mid + 1;
    else end = mid;
  }
  p.codes[i] = static_cast<uint8_t>(start);
}

template <class T, int kGroup>
void launch_group(const QuantizeNf4Launch& p, cudaStream_t stream) {
  constexpr int kThreads = kGroup > 256 ? kGroup : 256;
  const int64_t threads = p.n / kPer;
  const auto blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  quantize_nf4_kernel<T, kGroup><<<blocks, kThreads, 0, stream>>>(p);
}

}  // namespace

void launch_quantize_nf4(const QuantizeNf4Launch& p, cudaStream_t stream) {
  if (p.n <= 0) return;
  dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (p.log2_blocksize) {  // blocksize 16..4096: 2..512 threads per block
      case 4: launch_group<T, 2>(p, stream); break;
      case 5: launch_group<T, 4>(p, stream); break;
      case 6: launch_group<T, 8>(p, stream); break;
      case 7: launch_group<T, 16>(p, stream); break;
      case 8: launch_group<T, 32>(p, stream); break;
      case 9: launch_group<T, 64>(p, stream); break;
      case 10: launch_group<T, 128>(p, stream); break;
      case 11: launch_group<T, 256>(p, stream); break;
      default: launch_group<T, 512>(p, stream); break;
    }
  });
}

void launch_quantize_absmax(const QuantizeAbsmaxLaunch& p, cudaStream_t stream) {
  if (p.n <= 0) return;
  const auto blocks = static_cast<unsigned>((p.n + 255) / 256);
  quantize_absmax_kernel<<<blocks, 256, 0, stream>>>(p);
}

}  // namespace ax::nf4
