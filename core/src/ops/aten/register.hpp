// The `aten` backends: the production fallback of core's ops, in the compute dtype through ATen's own
// kernels (cuBLAS GEMMs, LibTorch's flash attention). `reference` stays the fp32 oracle they are certified
// against; selection tries aten before reference (core/src/selection.cpp) and plugins before both.
#pragma once
#include "axengine/registry.hpp"

namespace ax::ops {
// Registers linear.lora/aten (cpu + cuda, bf16/fp16, dense and packed W), attention/aten (cuda sm_80+,
// bf16/fp16), norm_rope/aten, linear_attention/aten and causal_conv1d/aten (cpu + cuda, fp32/bf16/fp16). Needs core's ops registered first
// (register_reference_kernels).
void register_aten_kernels(ax::Registry& registry);
}  // namespace ax::ops
