// Quantise / dequantise helpers for the weight formats of quant_formats.hpp, in plain ATen (CPU and CUDA).
// They define the formats in code: the reference backends, the tests and the model loaders (QLoRA) use
// them, and tests/data/quant/ holds goldens from the real peers (bitsandbytes, torchao) that pin them.
#pragma once
#include <array>
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"

namespace ax::ops {

// The 16 NF4 values (bitsandbytes), indexed by 4-bit code.
const std::array<float, 16>& nf4_values();
// The 16 E2M1 values, indexed by code (bit 3 = sign, bits 2-1 = exponent, bit 0 = mantissa):
// 0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, ..., -6.
const std::array<float, 16>& e2m1_values();
// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)), fp32 [256] on CPU: the code
// for double-quantised nf4 absmax.
at::Tensor bnb_dynamic_map();

// Two 4-bit codes per byte along the last dim (which must be even). first_high: the element with the
// even index goes in the high nibble (bitsandbytes nf4); otherwise the low nibble (mxfp4 / nvfp4).
at::Tensor pack_nibbles(const at::Tensor& codes, bool first_high);
at::Tensor unpack_nibbles(const at::Tensor& packed, bool first_high);  // uint8 [..., 2n] codes 0..15

// fp32 -> E2M1 codes (uint8 0..15): round to nearest, ties to even, saturating at ±6 (as torchao's
// f32_to_f4_unpacked); negative values (also those rounding to 0) get the sign bit. NaN is not
// representable and maps to code 0; callers never pass NaN.
at::Tensor e2m1_encode(const at::Tensor& x);
at::Tensor e2m1_decode(const at::Tensor& codes);   // -> fp32
at::Tensor e8m0_decode(const at::Tensor& scales);  // uint8 s -> fp32 2^(s-127) (255 = NaN)
at::Tensor e4m3_decode(const at::Tensor& scales);  // float8_e4m3fn (or its uint8 bits) -> fp32

// Quantisers, matching the peers bit for bit on CPU (tests/unit/ops_quant_goldens_test.cpp):
//  nf4  : bitsandbytes quantize_4bit(quant_type="nf4", compress_statistics=double_quant) — absmax per
//         block of the flattened tensor, nearest NF4 value (ties to the lower code); double quant
//         subtracts the mean absmax and quantises the rest with quantize_blockwise (dynamic map, 256).
//  mxfp4: torchao MXTensor.to_mx(elem_dtype=float4_e2m1fn_x2, block_size=32, scaling_mode=FLOOR) along
//         `axis`: scale = 2^(floor(log2(amax)) - 2), clamped to E8M0's range.
//  nvfp4: torchao nvfp4_quantize with a per-tensor scale amax/(448·6) (or one per expert with
//         per_expert_global_scale, the leading dim), block scale amax_block/6/global_scale in E4M3.
// `w` must be fp32/bf16/fp16 (values are read as fp32); the weight's device is w's device.
WeightTensor quantize_nf4(const at::Tensor& w, int64_t blocksize = 64, bool double_quant = false);
WeightTensor quantize_mxfp4(const at::Tensor& w, int64_t axis = -1);
WeightTensor quantize_nvfp4(const at::Tensor& w, int64_t axis = -1, bool per_expert_global_scale = false);

// Dequantise to `dtype` (fp32/bf16/fp16/fp64); values are computed in fp32 and rounded once.
// `experts` (optional int64 [S]): only weight[experts] (docs/ops/dequant.md, selective form).
// A dense weight is returned converted (and indexed). Validates the weight (validate_weight).
at::Tensor dequantize(const WeightTensor& w, at::ScalarType dtype, const at::Tensor& experts = {});

}  // namespace ax::ops
