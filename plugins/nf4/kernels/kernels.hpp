// The launchers of the nf4 kernels and their arguments: plain structs of pointers, shared by the .cu
// kernels (which see no torch headers) and the ATen glue (../src). The glue validates shapes, dtypes and
// devices; a launcher only queues on `stream` and the glue checks the launch afterwards.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ax::nf4 {

enum class DType { fp32, bf16, fp16 };

// Elements [start, start + count) of a flattened nf4 weight into out[0, count). Element e has code
// (codes[e/2] >> 4) & 15 for even e, codes[e/2] & 15 for odd e, and value NF4[code] · absmax(e / blocksize):
//   plain        absmax(b) = absmax[b]
//   double quant absmax(b) = nested_code[qabsmax[b]] · nested_scales[b / nested_blocksize] + nested_offset
// each product and sum rounded in fp32 (no fused multiply-add), then rounded once to `dtype`: the op
// order of ops::dequantize, so the result is bit-exact with it.
struct DequantLaunch {
  const uint8_t* codes = nullptr;
  const float* absmax = nullptr;          // plain
  const uint8_t* qabsmax = nullptr;       // double quant
  const float* nested_code = nullptr;     // double quant, [256]
  const float* nested_scales = nullptr;   // double quant
  float nested_offset = 0.0f;
  int64_t nested_blocksize = 256;
  int log2_blocksize = 6;                 // blocksize is a power of two, 16..4096
  int64_t start = 0, count = 0;
  void* out = nullptr;
  DType dtype = DType::bf16;
  // Several ranges of `count` elements in one launch: the s-th of `slices` starts at element
  // experts[s]·count when `experts` is set (dequant's selective form; the ids are read on the device: no
  // host sync; count must be a multiple of the blocksize), else at start + s·src_stride (a block of
  // columns of a row-major matrix: slices = rows, src_stride = row length); it goes to
  // out[s·count, (s+1)·count).
  const int64_t* experts = nullptr;
  int64_t slices = 1;
  int64_t src_stride = 0;
};
void launch_dequant(const DequantLaunch& p, cudaStream_t stream);

// bitsandbytes' blockwise nearest-code quantisation (core's blockwise_nearest) of n = nblocks·blocksize
// values read as fp32 (x is fp32/bf16/fp16): absmax per block (NaN propagates, as at::max does), then for
// each value v = clamp(x · reciprocal(max(absmax, 1e-38)), -1, 1) and code = the number of `bounds`
// (the midpoints of the sorted code table) b with !(b >= v) — torch.bucketize's lower bound, so a value
// on a midpoint takes the lower code.
// Stage 1 (nf4): 15 bounds, codes packed two per byte, first element in the high nibble.
struct QuantizeNf4Launch {
  const void* x = nullptr;
  DType dtype = DType::fp32;
  int64_t n = 0;
  int log2_blocksize = 6;
  float bounds[15] = {};
  uint8_t* codes = nullptr;  // [n/2]
  float* absmax = nullptr;   // [n/blocksize]
};
void launch_quantize_nf4(const QuantizeNf4Launch& p, cudaStream_t stream);

// Stage 2 (double quant): centred[i] = absmax[i] - *offset (fp32), quantised in blocks of 256 (the last
// one may be shorter) against the 255 midpoints of the signed dynamic map; one byte code per value.
struct QuantizeAbsmaxLaunch {
  const float* absmax = nullptr;  // [n]
  const float* offset = nullptr;  // device scalar: mean(absmax)
  const float* bounds = nullptr;  // [255], device
  int64_t n = 0;
  uint8_t* codes = nullptr;       // [n]
  float* nested_absmax = nullptr; // [ceil(n / 256)]
};
void launch_quantize_absmax(const QuantizeAbsmaxLaunch& p, cudaStream_t stream);

}  // namespace ax::nf4
