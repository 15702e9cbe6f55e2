// Picking the next token from a row of logits: greedy, or sampled with temperature, top-k and top-p
// (nucleus), as transformers' generate does with do_sample (its logits warpers, in that order).
#pragma once
#include <cstdint>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace ax::train {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (argmax, the first of equal maxima, as torch.argmax)
  double top_p = 1.0;        // keep the most likely tokens whose probabilities sum to top_p (at least one)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  uint64_t seed = 0;         // sequence i of a call samples from its own generator, seeded seed + i
};

// UsageError naming the option when a value is out of range (temperature < 0, top_p not in (0, 1], top_k < 0).
void check_sampling(const SamplingOptions& o);

// The next token after `logits` (fp32 [V] on the CPU). `gen` is used only when sampling.
int64_t sample_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen);

}  // namespace ax::train
