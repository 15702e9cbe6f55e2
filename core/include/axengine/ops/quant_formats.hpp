// Weight tensors as the kernel ops receive them: dense, or quantised to nf4 / mxfp4 / nvfp4, or block-scaled
// fp8 as fine-grained FP8 checkpoints store it.
//
// The bit-level definition of every format (nibble order, scale encodings, block order) is written in
// docs/ops/dequant.md; the comments here only say which field holds what. One struct covers all formats
// so that an op argument is simply "a weight" and backends switch on `format`.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ax::ops {

enum class WeightFormat { dense, nf4, mxfp4, nvfp4, fp8 };

// "dense", "nf4", "mxfp4", "nvfp4", "fp8" — the names Requirements::formats and KernelQuery::format use.
const char* to_string(WeightFormat format);
std::optional<WeightFormat> parse_weight_format(std::string_view name);

// Compute dtype names used by Requirements / KernelQuery: fp32, bf16, fp16 (fp64 is accepted by the
// reference backend only, for gradient checks). Throws UsageError for other dtypes.
std::string dtype_name(at::ScalarType dtype);
std::optional<at::ScalarType> parse_dtype(std::string_view name);

// A (possibly quantised) weight. Its logical shape is `shape`; dequantising gives a tensor of that shape.
//
//   dense : `values` holds the weight (fp32/bf16/fp16); `shape` == values.sizes(). Every other field empty.
//   nf4   : bitsandbytes Linear4bit/Params4bit layout. The logical tensor is flattened row-major; element i
//           has 4-bit code (codes[i/2] >> 4) & 15 when i is even, codes[i/2] & 15 when odd (first element in
//           the HIGH nibble) and value NF4[code] * absmax(i / blocksize).
//           codes: uint8 [numel/2] (any shape with that numel; bnb stores [numel/2, 1]).
//           scales: the per-block absmax, fp32 [numel/blocksize]  — or, double-quantised (bnb
//           compress_statistics=True): uint8 [numel/blocksize] codes into `nested_code` with
//             absmax(b) = nested_code[scales[b]] * nested_scales[b / nested_blocksize] + nested_offset.
//   mxfp4 : OCP MX FP4. Elements run in blocks of 32 along axis `axis` (the reduction axis K of the
//           op); codes are E2M1, two per byte along that axis, FIRST element in the LOW nibble.
//           codes: uint8, the logical shape with shape[axis] halved. scales: uint8 E8M0 (2^(s-127)), the
//           logical shape with shape[axis] divided by 32. value = E2M1[code] * 2^(scale-127).
//   nvfp4 : NVIDIA NVFP4. As mxfp4 but blocks of 16 and scales are float8_e4m3fn (dtype Float8_e4m3fn, or
//           uint8 holding the same bits), times `global_scale`, fp32 — a scalar, or [shape[0]] (one per
//           expert) — value = E2M1[code] * float(scale) * global_scale.
//   fp8   : fine-grained FP8 (DeepSeek-V3 / GLM-4.5 "-FP8" checkpoints, kept as stored). codes: float8_e4m3fn,
//           the logical shape [..., R, C]; scales: fp32 [..., ceil(R/block_rows), ceil(C/blocksize)], one per
//           block_rows x blocksize block of the last two dims (edge blocks take their block's scale);
//           value = float(code) * scale.
struct WeightTensor {
  WeightFormat format = WeightFormat::dense;
  // fp8: rows (dim -2) per scale; 0 for the other formats. Declared here, in the padding after `format`, so the
  // struct's size and every other offset stay those of ABI 8.
  int32_t block_rows = 0;
  std::vector<int64_t> shape;  // logical shape

  at::Tensor values;  // dense only

  at::Tensor codes;   // nf4/mxfp4/nvfp4: uint8, two 4-bit codes per byte; fp8: float8_e4m3fn, one per element
  at::Tensor scales;  // nf4: absmax (fp32, or uint8 when double-quantised); mxfp4: E8M0 uint8; nvfp4: E4M3; fp8: fp32
  int64_t blocksize = 0;  // nf4: 64 (bitsandbytes allows 32..4096, power of two); mxfp4: 32; nvfp4: 16; fp8: columns per scale
  int64_t axis = -1;      // mxfp4/nvfp4: the blocked axis of the logical shape (negative counts from the end)

  // nf4 double quantisation (all empty / 0 when not double-quantised)
  at::Tensor nested_scales;    // fp32 [ceil(nblocks / nested_blocksize)]
  at::Tensor nested_code;      // fp32 [256]: the bitsandbytes signed dynamic map (ops::bnb_dynamic_map())
  double nested_offset = 0.0;  // the mean of the absmax that was subtracted before quantising them
  int64_t nested_blocksize = 256;

  at::Tensor global_scale;  // nvfp4: fp32 scalar or [shape[0]]

  static WeightTensor dense(at::Tensor values);

  bool is_dense() const { return format == WeightFormat::dense; }
  bool double_quant() const { return format == WeightFormat::nf4 && nested_scales.defined(); }
  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  at::Device device() const;      // of `values` or `codes`
  std::string describe() const;   // "nf4[8, 64, 32] blocksize 64 double-quant", for errors and logs
  WeightTensor to(const at::Device& device) const;  // every tensor moved (no copy when already there)
};

// Checks a weight's internal consistency (field dtypes, sizes against `shape`, one device) and throws
// UsageError naming `what` ("w", "weight") and the field at fault. Does not look at tensor values.
void validate_weight(const WeightTensor& w, const std::string& what);

}  // namespace ax::ops
