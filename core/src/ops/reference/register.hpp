// The `reference` backend of every kernel op: plain ATen, CPU and CUDA, readable first. It is the ground
// truth of the conformance suite and the engine's fallback when no plugin backend fits.
#pragma once
#include "axengine/registry.hpp"

namespace ax::ops {
// Registers reference backends for moe.experts, moe.mlp, dequant, norm_rope, attention, linear.lora, rms_norm, swiglu,
// linear_ce, linear_attention and causal_conv1d
// (devices cpu + cuda, dtypes fp32/bf16/fp16, every weight format and layout).
void register_reference_kernels(ax::Registry& registry);
}  // namespace ax::ops
