// Greedy decoding through Model::forward, many prompts at once: the sequences are packed into one row
// (cu_seqlens keeps them apart), so no padding and no KV cache are needed. Fine for evaluation of short
// answers; not a serving path.
#pragma once
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/model.hpp"

namespace ax::train {

// Generates up to max_new[i] tokens after prompts[i], stopping a sequence early at `eos` (kept in the
// output; eos < 0: never). Sequences are grouped so a forward pass holds at most `token_budget` tokens.
std::vector<std::vector<int32_t>> generate_greedy(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<int64_t>& max_new, int32_t eos, at::Device device,
                                                  int64_t token_budget = 8192);

}  // namespace ax::train
