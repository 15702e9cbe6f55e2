// Fine-grained FP8 weights (WeightFormat::fp8, quant_formats.hpp) made from dense ones. No model load quantises
// to fp8 (weight_format = "fp8" keeps an FP8 checkpoint's own bytes); the conformance suite and the tests make
// their fp8 weights with this. A separate header so that the ops everyone includes do not change for it.
#pragma once
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"

namespace ax::ops {

// `w` (fp32/bf16/fp16, >= 2 dims) in blocks of block_rows x block_cols over its last two dims, with the arithmetic
// of transformers 5.23's Fp8Quantize (integrations/finegrained_fp8.py): per block scale = 448 / amax (1 for an
// all-zero block; Python computes it as reciprocal(amax) * 448), codes = clamp(w * scale, ±448) rounded to
// float8_e4m3fn, scales (weight_scale_inv) = 1 / scale (a reciprocal).
// Edge blocks of sizes that are not multiples of the block (which Fp8Quantize leaves unquantised) take the amax of
// the elements they hold, as DeepSeek's quantiser does.
WeightTensor quantize_fp8_blocks(const at::Tensor& w, int64_t block_rows, int64_t block_cols);

}  // namespace ax::ops
