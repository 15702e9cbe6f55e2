// The `aten` backends of rms_norm, swiglu and linear_ce (bf16/fp16, CPU and CUDA).
#pragma once
#include <cstdint>
#include <memory>

#include "axengine/ops/linear_ce.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"
#include "axengine/registry.hpp"

namespace ax::ops {
// Bound on one chunk of the aten linear_ce's fp32 logits (its compute-dtype copy adds at most half again):
// a code constant for now, not a config key.
inline constexpr int64_t kAtenLinearCeChunkBytes = int64_t(256) << 20;

std::shared_ptr<RmsNorm> make_aten_rms_norm();
std::shared_ptr<Swiglu> make_aten_swiglu();
// chunk_bytes: the registered backend uses kAtenLinearCeChunkBytes; tests pass small ones to force many chunks.
std::shared_ptr<LinearCe> make_aten_linear_ce(int64_t chunk_bytes);

// Registers them; call after register_reference_kernels (the ops must be registered first).
void register_aten_fusion_kernels(ax::Registry& registry);
}  // namespace ax::ops
