// Packed expert weights (nf4, mxfp4, nvfp4) as the W operand of the grouped GEMM (moe_gemm_impl.cuh).
//
// PackedTile reads the codes and scales of one k-tile of W_e from global memory, decodes them in
// registers and writes the tile to shared memory in exactly the layout the dense path's cp.async
// produces (ROWS x COLS, row pitch COLS + 8, COLS the contiguous direction of the stored matrix), so
// the ldmatrix / mma.sync code is the same for every format. There is no dequantised copy of the weight
// anywhere: the packed bytes stay packed in global memory and only tiles of experts that own rows run,
// so only routed experts' bytes are read.
//
// The two halves of a tile load are split so global latency hides behind the MMAs: fetch() issues the
// loads of k-tile kt + STAGES - 1 into registers before the MMAs of tile kt, store() decodes them into
// shared memory after those MMAs. Shapes whose rows are not 8-element aligned (or unaligned pointers)
// take an element-wise path in store() instead (fetch() does nothing then).
//
// Formats and the stored matrix S_e (R x C, C contiguous) are described with PackedWeight in
// moe_gemm.hpp; the bits are defined in docs/ops/dequant.md. Every value is table[code] * scale in fp32,
// rounded once to T: the same numbers as ops::dequantize followed by a cast.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "element.cuh"
#include "moe_gemm.hpp"

namespace ax::scattermoe::detail {

// The 16 values of a 4-bit code: NF4 (bitsandbytes) or E2M1 (codes 8..15 negative, 8 is -0). A switch,
// not an indexed local array, so no kernel gets a stack frame for it (it runs once per block).
template <WeightFormat F>
__device__ __forceinline__ float code_value(int c) {
  if constexpr (F == WeightFormat::nf4) {
    switch (c) {
      case 0: return -1.0f;
      case 1: return -0.6961928009986877f;
      case 2: return -0.5250730514526367f;
      case 3: return -0.39491748809814453f;
      case 4: return -0.28444138169288635f;
      case 5: return -0.18477343022823334f;
      case 6: return -0.09105003625154495f;
      case 7: return 0.0f;
      case 8: return 0.07958029955625534f;
      case 9: return 0.16093020141124725f;
      case 10: return 0.24611230194568634f;
      case 11: return 0.33791524171829224f;
      case 12: return 0.44070982933044434f;
      case 13: return 0.5626170039176941f;
      case 14: return 0.7229568362236023f;
      default: return 1.0f;
    }
  } else {
    // E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit. Magnitude codes 2..7 are normal numbers
    // (fp32 bits: (code << 22) + (126 << 23)); code 1 is the subnormal 0.5, code 0 zero.
    const uint32_t mag = static_cast<uint32_t>(c) & 7u;
    const uint32_t bits = mag >= 2u ? (mag << 22) + (126u << 23) : mag * 0x3f000000u;
    return __uint_as_float(bits | ((static_cast<uint32_t>(c) & 8u) << 28));
  }
}

// E8M0: 2^(s-127) as fp32 bits; s = 0 is the denormal 2^-127, s = 255 NaN (as ops::e8m0_decode).
__device__ __forceinline__ float e8m0_value(uint32_t s) {
  const uint32_t bits = s == 0u ? 0x00400000u : (s == 255u ? 0x7fc00000u : s << 23);
  return __uint_as_float(bits);
}
__device__ __forceinline__ float e4m3_value(uint32_t s) {
  __nv_fp8_e4m3 v;
  v.__x = static_cast<__nv_fp8_storage_t>(s);
  return static_cast<float>(v);
}

// The per-block table of code values in shared memory: a lookup there is one conflict-free LDS (16
// words in 16 banks), cheaper than the bit arithmetic or a select tree per element.
template <WeightFormat F>
__device__ __forceinline__ float* code_table() {
  __shared__ float table[16];
  return table;
}

// Loader of one W tile. ROWS x COLS: the tile of the stored matrix (COLS contiguous); COLS_ADVANCE:
// the k loop walks along the columns (w_kmajor: rows are n, fixed for the block) rather than down the
// rows (rows are k, columns n fixed). BLK_ROWS (mxfp4/nvfp4): nibble pairs and scale blocks run down
// the rows (layout EKN) instead of along them (ENK); nf4 pairs always run along the flat index.
//
// Register budget matters (the 128x128 kernel sits at 128 registers): the loader keeps only the block's
// expert, first fixed row/column, the aligned-path flag and the fetched words; pointers, extents and
// format fields are read from the kernel arguments (constant bank) where they are used.
template <class T, WeightFormat F, bool BLK_ROWS, int ROWS, int COLS, bool COLS_ADVANCE, int THREADS>
struct PackedTile {
  static constexpr bool kNf4 = F == WeightFormat::nf4;
  static constexpr bool kPairRows = !kNf4 && BLK_ROWS;  // one unit = 8 columns of two rows
  static constexpr int kBs = F == WeightFormat::mxfp4 ? 32 : 16;  // mxfp4 / nvfp4 block
  static constexpr int kCpr = COLS / 8;
  static constexpr int kChunks = ROWS * kCpr;  // 16-byte chunks of the shared tile
  static constexpr int kUnits = kPairRows ? kChunks / 2 : kChunks;
  static constexpr int kIt = (kUnits + THREADS - 1) / THREADS;
  static constexpr int kWords = kPairRows ? 2 : 1;  // 32-bit words of codes (and of scales) per unit
  static_assert(COLS % 8 == 0 && (!kPairRows || ROWS % 2 == 0), "tile shape");

  int e, fixed0;
  bool vec;
  // The fetched k-tile (vec path): codes, scales (raw bytes, fp32 bits, or the double-quant byte), the
  // nested scale of nf4 double quant, and whether the unit lies inside the matrix.
  uint32_t q[kIt][kWords], s[kIt][kWords];
  float ns[kIt];
  bool ok[kIt];

  // Expert e's stored matrix is R x C (moe_gemm.hpp, PackedWeight).
  template <class Args>
  __device__ __forceinline__ static int rows_of(const Args& a) { return COLS_ADVANCE ? a.N : a.K; }
  template <class Args>
  __device__ __forceinline__ static int cols_of(const Args& a) { return COLS_ADVANCE ? a.K : a.N; }

  // All threads of the block call it (it synchronises once: the code table must be complete before
  // the first store). fixed0: the first row (COLS_ADVANCE) or column of the block's tiles; vec_ok:
  // 8-element aligned rows and 16-byte aligned codes/scales (checked on the host).
  __device__ __forceinline__ void init(int e_, int fixed0_, bool vec_ok) {
    if (threadIdx.x < 16) code_table<F>()[threadIdx.x] = code_value<F>(static_cast<int>(threadIdx.x));
    e = e_;
    fixed0 = fixed0_;
    vec = vec_ok;
    __syncthreads();
  }

  // Expert e's codes and (mxfp4/nvfp4) scales; nf4 addresses the whole tensor by flat index.
  template <class Args>
  __device__ __forceinline__ const uint8_t* codes_of(const Args& a) const {
    if constexpr (kNf4) return a.wq.codes;
    else return a.wq.codes + e * (static_cast<int64_t>(rows_of(a)) * cols_of(a) / 2);
  }
  template <class Args>
  __device__ __forceinline__ const uint8_t* scales_of(const Args& a) const {
    const uint8_t* p = static_cast<const uint8_t*>(a.wq.scales);
    if constexpr (kNf4) return p;
    else return p + e * (static_cast<int64_t>(rows_of(a)) * cols_of(a) / kBs);
  }
  template <class Args>
  __device__ __forceinline__ int64_t flat(const Args& a, int gr, int gc) const {  // nf4
    return (static_cast<int64_t>(e) * rows_of(a) + gr) * cols_of(a) + gc;
  }
  __device__ __forceinline__ static int log2i(int v) { return __ffs(v) - 1; }  // v a power of two

  // Unit `it` of this thread: its top-left element in the tile, and whether it exists at all.
  __device__ __forceinline__ static bool unit(int it, int& r, int& c) {
    const int idx = static_cast<int>(threadIdx.x) + it * THREADS;
    r = (idx / kCpr) * (kPairRows ? 2 : 1);
    c = (idx % kCpr) * 8;
    return kUnits % THREADS == 0 || idx < kUnits;
  }
  __device__ __forceinline__ void coords(int r, int c, int k0, int& gr, int& gc) const {
    gr = COLS_ADVANCE ? fixed0 + r : k0 + r;
    gc = COLS_ADVANCE ? k0 + c : fixed0 + c;
  }

  // Issues the loads of the k-tile starting at k0 (vec path only).
  template <class Args>
  __device__ __forceinline__ void fetch(const Args& a, int k0) {
    if (!vec) return;
    const int R = rows_of(a), C = cols_of(a);
    const uint8_t* codes = codes_of(a);
    const uint8_t* scales8 = scales_of(a);
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      int r, c, gr, gc;
      ok[it] = unit(it, r, c);
      coords(r, c, k0, gr, gc);
      ok[it] = ok[it] && gr < R && gc < C;  // whole units: C % 8 == 0 and R is even where pairs span rows
      if (!ok[it]) continue;
      if constexpr (kNf4) {
        const int64_t i = flat(a, gr, gc);  // a multiple of 8
        q[it][0] = __ldg(reinterpret_cast<const unsigned int*>(codes + (i >> 1)));
        const int64_t b = i >> log2i(a.wq.blocksize);  // the 8 elements share one block (blocksize >= 16)
        if (a.wq.nested_code != nullptr) {
          s[it][0] = __ldg(scales8 + b);
          ns[it] = __ldg(a.wq.nested_scales + (b >> log2i(a.wq.nested_blocksize)));
        } else {
          s[it][0] = __float_as_uint(__ldg(static_cast<const float*>(a.wq.scales) + b));
        }
      } else if constexpr (kPairRows) {  // rows gr, gr + 1 (gr even) share bytes and scales
        const uint2 cv = __ldg(reinterpret_cast<const uint2*>(codes + static_cast<int64_t>(gr >> 1) * C + gc));
        const uint2 sv = __ldg(reinterpret_cast<const uint2*>(scales8 + static_cast<int64_t>(gr / kBs) * C + gc));
        q[it][0] = cv.x;
        q[it][1] = cv.y;
        s[it][0] = sv.x;
        s[it][1] = sv.y;
      } else {  // 8 elements of one row, one scale block
        const int64_t i = static_cast<int64_t>(gr) * C + gc;
        q[it][0] = __ldg(reinterpret_cast<const unsigned int*>(codes + (i >> 1)));
        s[it][0] = __ldg(scales8 + i / kBs);
      }
    }
  }

  // nvfp4's global scale of expert e (1 for the other formats: unused there).
  template <class Args>
  __device__ __forceinline__ float global_scale(const Args& a) const {
    if constexpr (F == WeightFormat::nvfp4) return __ldg(a.wq.global_scale + (a.wq.global_per_expert ? e : 0));
    else return 1.f;
  }
  __device__ __forceinline__ static float block_scale(uint32_t byte, float g) {
    if constexpr (F == WeightFormat::mxfp4) return e8m0_value(byte);
    else return __fmul_rn(g, e4m3_value(byte));  // (global * E4M3) first, as torchao and the reference
  }
  template <class Args>
  __device__ __forceinline__ float nf4_absmax_dq(const Args& a, uint32_t qbyte, float nested) const {
    return __fadd_rn(__fmul_rn(__ldg(a.wq.nested_code + qbyte), nested), a.wq.nested_offset);
  }

  __device__ __forceinline__ static void put(T* dst, const float (&v)[8]) {
    uint4 u;
    u.x = pack2<T>(v[0], v[1]);
    u.y = pack2<T>(v[2], v[3]);
    u.z = pack2<T>(v[4], v[5]);
    u.w = pack2<T>(v[6], v[7]);
    *reinterpret_cast<uint4*>(dst) = u;
  }

  // Decodes the k-tile at k0 into the shared tile `sm` (fetched registers, or element-wise).
  template <class Args>
  __device__ __forceinline__ void store(const Args& a, T* sm, int k0) const {
    if (!vec) return store_elementwise(a, sm, k0);
    const float* tab = code_table<F>();
    const float g = global_scale(a);
#pragma unroll
    for (int it = 0; it < kIt; ++it) {
      int r, c;
      if (!unit(it, r, c)) continue;
      T* dst = sm + r * (COLS + 8) + c;
      float v[8], v2[8];
      if (!ok[it]) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = v2[j] = 0.f;
      } else if constexpr (kNf4) {
        const float am = a.wq.nested_code != nullptr ? nf4_absmax_dq(a, s[it][0], ns[it]) : __uint_as_float(s[it][0]);
#pragma unroll
        for (int j = 0; j < 8; ++j)  // even elements in the HIGH nibble of their byte
          v[j] = __fmul_rn(tab[(q[it][0] >> (8 * (j / 2) + ((j & 1) ? 0 : 4))) & 15u], am);
      } else if constexpr (kPairRows) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // byte j: column c + j, low nibble row r, high nibble row r + 1
          const uint32_t byte = (q[it][j / 4] >> (8 * (j % 4))) & 0xffu;
          const float sc = block_scale((s[it][j / 4] >> (8 * (j % 4))) & 0xffu, g);
          v[j] = __fmul_rn(tab[byte & 15u], sc);
          v2[j] = __fmul_rn(tab[byte >> 4], sc);
        }
      } else {
        const float sc = block_scale(s[it][0], g);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(tab[(q[it][0] >> (4 * j)) & 15u], sc);  // LOW first
      }
      put(dst, v);
      if constexpr (kPairRows) put(dst + (COLS + 8), v2);
    }
  }

  // Element (gr, gc) of expert e's stored matrix, inside it.
  template <class Args>
  __device__ __forceinline__ float value_at(const Args& a, int gr, int gc) const {
    const float* tab = code_table<F>();
    const int C = cols_of(a);
    const uint8_t* codes = codes_of(a);
    const uint8_t* scales8 = scales_of(a);
    if constexpr (kNf4) {
      const int64_t i = flat(a, gr, gc);
      const uint32_t byte = codes[i >> 1];
      const uint32_t code = (i & 1) ? (byte & 15u) : (byte >> 4);
      const int64_t b = i >> log2i(a.wq.blocksize);
      const float am = a.wq.nested_code != nullptr
                           ? nf4_absmax_dq(a, scales8[b], a.wq.nested_scales[b >> log2i(a.wq.nested_blocksize)])
                           : static_cast<const float*>(a.wq.scales)[b];
      return __fmul_rn(tab[code], am);
    } else if constexpr (kPairRows) {
      const uint32_t byte = codes[static_cast<int64_t>(gr >> 1) * C + gc];
      const uint32_t code = (gr & 1) ? (byte >> 4) : (byte & 15u);
      return __fmul_rn(tab[code], block_scale(scales8[static_cast<int64_t>(gr / kBs) * C + gc], global_scale(a)));
    } else {
      const int64_t i = static_cast<int64_t>(gr) * C + gc;
      const uint32_t byte = codes[i >> 1];
      const uint32_t code = (gc & 1) ? (byte >> 4) : (byte & 15u);
      return __fmul_rn(tab[code], block_scale(scales8[i / kBs], global_scale(a)));
    }
  }

  // The unaligned fallback: element by element, straight to shared memory, no prefetch. Deliberately
  // not unrolled: unrolled, its address arithmetic alone pushed the 128x128 kernels into spilling.
  template <class Args>
  __device__ __forceinline__ void store_elementwise(const Args& a, T* sm, int k0) const {
    const int R = rows_of(a), C = cols_of(a);
#pragma unroll 1
    for (int idx = static_cast<int>(threadIdx.x); idx < ROWS * COLS; idx += THREADS) {
      const int r = idx / COLS, c = idx % COLS;
      int gr, gc;
      coords(r, c, k0, gr, gc);
      sm[r * (COLS + 8) + c] = from_f<T>((gr < R && gc < C) ? value_at(a, gr, gc) : 0.f);
    }
  }
};

// The dense path has no packed operand.
template <class T, bool BLK_ROWS, int ROWS, int COLS, bool COLS_ADVANCE, int THREADS>
struct PackedTile<T, WeightFormat::dense, BLK_ROWS, ROWS, COLS, COLS_ADVANCE, THREADS> {};

// Host: whether the vec path of PackedTile applies (C = the stored matrix's contiguous extent).
inline bool packed_vec_ok(const PackedWeight& w, int64_t C) {
  auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return C % 8 == 0 && al(w.codes) && al(w.scales);
}

}  // namespace ax::scattermoe::detail
