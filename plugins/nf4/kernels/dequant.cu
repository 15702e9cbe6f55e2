// nf4 -> fp32/bf16/fp16 (kernels.hpp, DequantLaunch). Memory-bound: each thread decodes one group of
// kGroup = 16 elements aligned to 16 in the flattened weight — an 8-byte load of codes and 32 (bf16/fp16)
// or 64 (fp32) bytes of 16-byte stores — so a warp reads 256 contiguous bytes and writes 1-2 KiB. Since
// blocksize is a power of two >= 16, an aligned group lies inside one absmax block: one scale per thread
// (for double quant, two table lookups, one multiply and one add, as the reference does them). The table
// lives in shared memory (16 entries in 16 distinct banks: no conflicts). Groups cut by start/end, or
// pointers that do not allow the vector accesses, take an element-by-element path with the same math.
// The selective form runs its slices (experts) along grid.y, each a range like the plain form's.
#include "common.cuh"

namespace ax::nf4 {
namespace {

constexpr int kGroup = 16;
constexpr int kThreads = 256;

template <class T, bool kDouble>
__global__ void __launch_bounds__(kThreads) dequant_kernel(DequantLaunch p, bool vec_ok) {
  __shared__ float table[16];
  __shared__ float ncode[kDouble ? 256 : 1];
  if (threadIdx.x < 16) table[threadIdx.x] = kNf4Table[threadIdx.x];
  if constexpr (kDouble) ncode[threadIdx.x] = p.nested_code[threadIdx.x];  // kThreads == 256
  __syncthreads();

  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t slice = blockIdx.y; slice < p.slices; slice += gridDim.y) {
    const int64_t start = p.experts != nullptr ? p.experts[slice] * p.count : p.start + slice * p.src_stride;
    const int64_t end = start + p.count;
    T* out = static_cast<T*>(p.out) + slice * p.count - start;  // out[e] is element e's destination
    const int64_t first_group = start / kGroup, ngroups = (end - 1) / kGroup - first_group + 1;
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < ngroups; g += stride) {
      const int64_t e0 = (first_group + g) * kGroup;
      const int64_t b = e0 >> p.log2_blocksize;
      float s;
      if constexpr (kDouble) {
        // ops::dequantize: code[q] * nested_absmax[b / nbs] (one rounding), then + offset (another).
        s = __fadd_rn(__fmul_rn(ncode[p.qabsmax[b]], p.nested_scales[b / p.nested_blocksize]), p.nested_offset);
      } else {
        s = p.absmax[b];
      }
      const int64_t lo = e0 > start ? e0 : start;
      const int64_t hi = e0 + kGroup < end ? e0 + kGroup : end;
      if (vec_ok && lo == e0 && hi == e0 + kGroup) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p.codes + e0 / 2);
        const uint32_t words[2] = {raw.x, raw.y};
        float v[kGroup];
#pragma unroll
        for (int i = 0; i < kGroup / 2; ++i) {
          const uint32_t byte = (words[i / 4] >> (8 * (i % 4))) & 0xFFu;  // little-endian: byte i of the load
          v[2 * i] = __fmul_rn(table[byte >> 4], s);
          v[2 * i + 1] = __fmul_rn(table[byte & 15u], s);
        }
        if constexpr (sizeof(T) == 4) {
#pragma unroll
          for (int k = 0; k < kGroup / 4; ++k)
            store16(out + e0 + 4 * k, __float_as_uint(v[4 * k]), __float_as_uint(v[4 * k + 1]),
                    __float_as_uint(v[4 * k + 2]), __float_as_uint(v[4 * k + 3]));
        } else {
          uint32_t w[kGroup / 2];  // element 2i in the low half: the lower address
#pragma unroll
          for (int i = 0; i < kGroup / 2; ++i) w[i] = bits16(from_f<T>(v[2 * i])) | (bits16(from_f<T>(v[2 * i + 1])) << 16);
#pragma unroll
          for (int k = 0; k < kGroup / 8; ++k) store16(out + e0 + 8 * k, w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
        }
      } else {
        for (int64_t e = lo; e < hi; ++e) {
          const uint32_t byte = p.codes[e >> 1];
          const uint32_t c = (e & 1) ? (byte & 15u) : (byte >> 4);
          out[e] = from_f<T>(__fmul_rn(table[c], s));
        }
      }
    }
  }
}

}  // namespace

void launch_dequant(const DequantLaunch& p, cudaStream_t stream) {
  if (p.count <= 0 || p.slices <= 0) return;
  // Groups of one slice (at most one more than for the first when later slices are aligned differently).
  const int64_t start = p.experts != nullptr ? 0 : p.start % kGroup;
  const int64_t ngroups = (start + p.count - 1) / kGroup - start / kGroup + 1;
  int64_t bx = (ngroups + kThreads - 1) / kThreads;
  // Grid-stride loops beyond these: enough blocks to fill any GPU many times over.
  if (bx > (int64_t{1} << 20)) bx = int64_t{1} << 20;
  const int64_t by = p.slices < 65535 ? p.slices : 65535;
  const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Vector accesses: 8-byte code loads at codes + e0/2 (e0 a multiple of 16) and 16-byte stores at
    // out + s·count + (e0 - start_s): they hold for every group of every slice when they hold for the base
    // addresses and every slice's start is congruent to the first's mod 16 with count·sizeof(T) a
    // multiple of 16 (a selective slice's start and count are multiples of the blocksize, so of 16).
    const auto codes_addr = reinterpret_cast<uintptr_t>(p.codes);
    const auto out_base = reinterpret_cast<uintptr_t>(p.out) - static_cast<uintptr_t>(start) * sizeof(T);
    const bool slices_alike = p.slices == 1 || p.experts != nullptr ||
                              (p.src_stride % kGroup == 0 && (p.count * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    const bool vec_ok = codes_addr % 8 == 0 && out_base % 16 == 0 && slices_alike;
    if (p.qabsmax != nullptr)
      dequant_kernel<T, true><<<grid, kThreads, 0, stream>>>(p, vec_ok);
    else
      dequant_kernel<T, false><<<grid, kThreads, 0, stream>>>(p, vec_ok);
  });
}

}  // namespace ax::nf4
