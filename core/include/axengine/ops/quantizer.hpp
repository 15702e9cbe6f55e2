// Quantisers: the providers (registry kind "quantizer") that pack a dense frozen weight into one of the
// weight formats of quant_formats.hpp when a model loads with [model] weight_format != "dense" (QLoRA).
//
// Core registers `reference` for nf4, mxfp4 and nvfp4 (ops::quantize_* of quant.hpp, plain ATen on CPU and
// CUDA, bit-exact with bitsandbytes / torchao); a plugin may add a faster one through
// PluginRegistrar::quantizer, declaring the formats it produces in its descriptor's requires.formats (and
// the devices it runs on). docs/weights.md has the policy and the selection rule.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/ops/quant_formats.hpp"

namespace ax::ops {

struct QuantizeSpec {
  WeightFormat format = WeightFormat::nf4;
  int64_t blocksize = 64;         // nf4: elements per absmax block (a power of two, 16..4096)
  bool double_quant = false;      // nf4: quantise the absmax too (bitsandbytes compress_statistics)
  int64_t axis = -1;              // mxfp4 / nvfp4: the blocked axis, the reduction axis K of the op
  bool per_expert_scale = false;  // nvfp4: one global scale per index of dim 0 (an expert) instead of one
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  // Packs `w` (fp32/bf16/fp16/fp64, any shape the format's blocks fit) into spec.format on w's device.
  // Contract: deterministic, and the packed fields equal those of the reference (ops::quantize_*) bit for
  // bit, so a base quantised by any backend dequantises to the same numbers (adapters stay portable).
  virtual WeightTensor quantize(const at::Tensor& w, const QuantizeSpec& spec) = 0;
};

// Why `spec` cannot pack a tensor of `shape` (nf4: element count a multiple of blocksize; mxfp4 / nvfp4:
// the blocked axis a multiple of 32 / 16), or empty when it can.
std::string quantize_misfit(const std::vector<int64_t>& shape, const QuantizeSpec& spec);

// Bytes of every tensor a weight holds (codes, scales, nested scales and code, global scale; values when
// dense): what it keeps resident.
int64_t weight_bytes(const WeightTensor& w);

}  // namespace ax::ops
