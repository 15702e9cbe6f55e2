// What one sparse (MoE) decoder layer weighs, for `inspect`: its parameters split into the expert projections
// (routed and shared: what QLoRA of a large MoE packs) and the rest (attention, router, norms), and its bytes
// with the experts held dense bf16, nf4 or mxfp4 and the rest bf16. Bytes per parameter of each format as
// docs/weights.md's table gives them: bf16 2; nf4 0.5 + 4 / blocksize (an fp32 absmax per block of 64);
// mxfp4 0.5 + 1/32 (an E8M0 scale per 32 along K); and the layer as a fine-grained FP8 release stores it, every
// projection (experts and attention) in e4m3, 1 + 4 / (bm x bn) (an fp32 scale per block; the config's
// weight_block_size, [128, 128] when it has none), kept so by weight_format = "fp8".
#pragma once
#include <cstdint>
#include <string>

#include "models/hf_config.hpp"

namespace ax::models {

struct MoeLayerBytes {
  int64_t layer = -1;        // the first sparse layer (-1: the model has none)
  int64_t expert_params = 0;  // routed + shared expert projections
  int64_t other_params = 0;   // attention, router, correction bias, norms
  int64_t other_projection_params = 0;  // the attention projections among other_params
  int64_t fp8_block = 128 * 128;        // elements per FP8 scale
  // Bytes of the layer with the experts in `format` ("bf16", "nf4", "mxfp4"), everything else bf16; "fp8": the
  // experts and the other projections in fp8, the rest bf16.
  double bytes(const std::string& format) const;
  double bytes_per_param(const std::string& format) const { return bytes(format) / double(expert_params + other_params); }
};

MoeLayerBytes moe_layer_bytes(const HfConfig& c);

// inspect's line: "MoE layer N    P params (experts E): bf16 x B/param (y GB), nf4 experts ..., mxfp4 experts ...,
// fp8 projections ...".
std::string moe_layer_bytes_line(const HfConfig& c);

}  // namespace ax::models
