// nf4 -> fp32/bf16/fp16 (kernels.hpp, DequantLaunch). Memory-bound, and the output is 4x (bf16) the
// codes read, so the kernel is built around its stores: a thread decodes items of kGroup = 8 elements
// aligned to 8 in the flattened weight — one 4-byte load of codes, one 16-byte store (two for fp32) — with
// consecutive lanes on consecutive items, so a warp's load covers 128 contiguous bytes and its store 512.
// Each thread has kItems items in flight: all their loads are issued before the first store (one item per
// thread ran at ~65% of the device copy bandwidth on an H200). Since blocksize is a power of two >= 16,
// an item lies inside one absmax block: one scale per item (for double quant, two table lookups, one
// multiply and one add, as the reference does them). The table lives in shared memory (16 entries in 16
// distinct banks: no conflicts). Items cut by start/end, or pointers that do not allow the vector
// accesses, take an element-by-element path with the same math. The selective form runs its slices
// (experts) along grid.y, each a range like the plain form's.
#include "common.cuh"

namespace ax::nf4 {
namespace {

constexpr int kGroup = 8;
constexpr int kItems = 4;
constexpr int kThreads = 256;

template <bool kDouble>
__device__ __forceinline__ float block_scale(const DequantLaunch& p, const float* ncode, int64_t b) {
  // ops::dequantize: code[q] * nested_absmax[b / nbs] (one rounding), then + offset (another).
  if constexpr (kDouble) {
    const int64_t nb = p.log2_nested_blocksize >= 0 ? b >> p.log2_nested_blocksize : b / p.nested_blocksize;
    return __fadd_rn(__fmul_rn(ncode[p.qabsmax[b]], p.nested_scales[nb]), p.nested_offset);
  }
  else
    return p.absmax[b];
}

template <class T, bool kDouble>
__global__ void __launch_bounds__(kThreads) dequant_kernel(DequantLaunch p, bool vec_ok) {
  __shared__ float table[16];
  __shared__ float ncode[kDouble ? 256 : 1];
  if (threadIdx.x < 16) table[threadIdx.x] = kNf4Table[threadIdx.x];
  if constexpr (kDouble) ncode[threadIdx.x] = p.nested_code[threadIdx.x];  // kThreads == 256
  __syncthreads();

  constexpr int64_t kPerBlock = int64_t{kThreads} * kItems;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kPerBlock;
  for (int64_t slice = blockIdx.y; slice < p.slices; slice += gridDim.y) {
    const int64_t start = p.experts != nullptr ? p.experts[slice] * p.count : p.start + slice * p.src_stride;
    const int64_t end = start + p.count;
    T* out = static_cast<T*>(p.out) + slice * p.count - start;  // out[e] is element e's destination
    const int64_t first_group = start / kGroup, ngroups = (end - 1) / kGroup - first_group + 1;
    for (int64_t g0 = static_cast<int64_t>(blockIdx.x) * kPerBlock + threadIdx.x; g0 < ngroups; g0 += stride) {
      uint32_t word[kItems];
      float s[kItems];
      bool full[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {  // the loads of every item first
        const int64_t g = g0 + int64_t{k} * kThreads;
        const int64_t e0 = (first_group + g) * kGroup;
        full[k] = vec_ok && g < ngroups && e0 >= start && e0 + kGroup <= end;
        word[k] = full[k] ? *reinterpret_cast<const uint32_t*>(p.codes + e0 / 2) : 0u;
        s[k] = g < ngroups ? block_scale<kDouble>(p, ncode, e0 >> p.log2_blocksize) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t g = g0 + int64_t{k} * kThreads;
        if (g >= ngroups) break;
        const int64_t e0 = (first_group + g) * kGroup;
        if (full[k]) {
          float v[kGroup];
#pragma unroll
          for (int i = 0; i < kGroup / 2; ++i) {
            const uint32_t byte = (word[k] >> (8 * i)) & 0xFFu;  // little-endian: byte i of the load
            v[2 * i] = __fmul_rn(table[byte >> 4], s[k]);
            v[2 * i + 1] = __fmul_rn(table[byte & 15u], s[k]);
          }
          if constexpr (sizeof(T) == 4) {
            store16(out + e0, __float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
            store16(out + e0 + 4, __float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]), __float_as_uint(v[7]));
          } else {
            uint32_t w[kGroup / 2];  // element 2i in the low half: the lower address
#pragma unroll
            for (int i = 0; i < kGroup / 2; ++i) w[i] = bits16(from_f<T>(v[2 * i])) | (bits16(from_f<T>(v[2 * i + 1])) << 16);
            store16(out + e0, w[0], w[1], w[2], w[3]);
          }
        } else {
          const int64_t lo = e0 > start ? e0 : start;
          const int64_t hi = e0 + kGroup < end ? e0 + kGroup : end;
          for (int64_t e = lo; e < hi; ++e) {
            const uint32_t byte = p.codes[e >> 1];
            const uint32_t c = (e & 1) ? (byte & 15u) : (byte >> 4);
            out[e] = from_f<T>(__fmul_rn(table[c], s[k]));
          }
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
  int64_t bx = (ngroups + int64_t{kThreads} * kItems - 1) / (int64_t{kThreads} * kItems);
  // Grid-stride loops beyond these: enough blocks to fill any GPU many times over.
  if (bx > (int64_t{1} << 20)) bx = int64_t{1} << 20;
  const int64_t by = p.slices < 65535 ? p.slices : 65535;
  const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(by));
  dispatch(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Vector accesses: 4-byte code loads at codes + e0/2 (e0 a multiple of 8) and 16-byte stores at
    // out + s·count + (e0 - start_s): they hold for every group of every slice when they hold for the base
    // addresses and every slice's start is congruent to the first's mod 8 with count·sizeof(T) a
    // multiple of 16 (a selective slice's start and count are multiples of the blocksize, so of 8).
    const auto codes_addr = reinterpret_cast<uintptr_t>(p.codes);
    const auto out_base = reinterpret_cast<uintptr_t>(p.out) - static_cast<uintptr_t>(start) * sizeof(T);
    const bool slices_alike = p.slices == 1 || p.experts != nullptr ||
                              (p.src_stride % kGroup == 0 && (p.count * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    const bool vec_ok = codes_addr % 4 == 0 && out_base % 16 == 0 && slices_alike;
    if (p.qabsmax != nullptr)
      dequant_kernel<T, true><<<grid, kThreads, 0, stream>>>(p, vec_ok);
    else
      dequant_kernel<T, false><<<grid, kThreads, 0, stream>>>(p, vec_ok);
  });
}

}  // namespace ax::nf4
