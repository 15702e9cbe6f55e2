// Generation with a KV cache (axengine/decode.hpp): prompts in, continuations out. Behind `axengine generate`,
// `axengine chat` and the eval's exact_match. Prompts are decoded batch_size at a time, each in its own cache
// row (no padding): a prefill of every prompt at once, then one token per unfinished row per step.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "axengine/decode.hpp"
#include "axengine/model.hpp"
#include "train/sampling.hpp"

namespace ax::train {

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  SamplingOptions sampling;
  std::vector<int64_t> eos_ids;   // a sequence ends at any of them (kept as its last token)
  // More end ids for some prompts (empty, or one list per prompt): a prompt rendered through a chat template
  // also ends at the template's end-of-turn token (chat_end_of_turn_ids, generate_io.hpp).
  std::vector<std::vector<int64_t>> prompt_eos_ids;
  // A sequence ends when its decoded text contains one of these; the text is cut before it (the tokens stay).
  std::vector<std::string> stop;
  // Token ids -> text. Required for `stop` and for streaming; gives Generation::text.
  std::function<std::string(const std::vector<int32_t>&)> detokenize;
  int64_t batch_size = 8;         // prompts decoded together
};

struct Generation {
  std::vector<int32_t> tokens;  // generated ids (the eos, or the token completing a stop string, included)
  std::string text;             // detokenized tokens without a final eos, cut before a stop string ("" without detokenize)
  std::string finish_reason;    // "eos", "stop" or "length"
};

// Called with (prompt index, new text) as text becomes final: the concatenation of a prompt's calls is its
// Generation::text. Text that could still turn into a stop string, or that ends in an incomplete UTF-8
// character, is held back until it cannot.
using TextStream = std::function<void(std::size_t, const std::string&)>;

// UsageError when the model has no KV-cached decode (the family does not implement CausalLmDecode).
CausalLmDecode& decoder_of(Model& model);

// `max_new` (optional) overrides max_new_tokens per prompt. `images` (optional, one entry per prompt, empty
// for a prompt without): the images of the prompt's placeholder tokens, as the family's chat image processor
// made them (axengine/decode.hpp's ImageDecode, which the model must then implement), prefilled with the prompt.
// UsageError for an empty prompt or bad options.
std::vector<Generation> generate(CausalLmDecode& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& options, const TextStream& stream = {},
                                 const std::vector<int64_t>& max_new = {}, const std::vector<DecodeImages>& images = {});

// Greedy answers for exact_match: up to max_new[i] tokens after prompts[i] (with images[i], as generate takes
// them), stopping early at `eos` (kept; eos < 0: never).
std::vector<std::vector<int32_t>> generate_greedy(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<int64_t>& max_new, int32_t eos,
                                                  const std::vector<DecodeImages>& images = {});

}  // namespace ax::train
