// Picking the next token from a row of logits: greedy, or sampled with temperature, top-k and top-p
// (nucleus), as transformers' generate does with do_sample (its logits warpers, in that order).
#pragma once
#include <cstdint>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "axengine/generation.hpp"

namespace ax::train {

using SamplingOptions = ax::SamplingOptions;  // axengine/generation.hpp

// UsageError naming the option when a value is out of range (temperature < 0, top_p not in (0, 1], top_k < 0).
void check_sampling(const SamplingOptions& o);

// The next token after `logits` (fp32 [V] on the CPU). `gen` is used only when sampling.
int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen);

}  // namespace ax::train
