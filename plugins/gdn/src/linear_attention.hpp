// The gdn plugin's linear_attention backend (docs/plugins/gdn.md): the host glue around the kernels of
// kernels/kernels.hpp, over either the CUDA launches (the plugin) or their one-thread host twins (tests).
#pragma once
#include <memory>

#include <axengine/ops/linear_attention.hpp>

#include "../kernels/kernels.hpp"

namespace ax::gdn {

// The largest key head dim the scan's shared memory holds (declined above it).
constexpr int64_t kMaxKeyDim = 256;

std::shared_ptr<ops::LinearAttention> make_linear_attention(const Kernels& kernels);

}  // namespace ax::gdn
