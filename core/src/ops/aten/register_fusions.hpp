// The `aten` backends of rms_norm, swiglu and linear_ce (bf16/fp16, CPU and CUDA).
#pragma once
#include "axengine/registry.hpp"

namespace ax::ops {
// Registers them; call after register_reference_kernels (the ops must be registered first).
void register_aten_fusion_kernels(ax::Registry& registry);
}  // namespace ax::ops
