// tokenizer.json (+ tokenizer_config.json) as a model load parses it, then the loaded tokenizer encodes and
// decodes a text: the JSON shapes every component (normalizer, pre-tokenizer with its regexes, BPE, post-
// processor, decoder) that the text then runs through.
//
// Input: tokenizer.json, tokenizer_config.json (may be empty), the text; separated by kSeparator lines.
#include <cstdlib>
#include <string>

#include "axengine/hf_tokenizer.hpp"
#include "harness.hpp"

AX_FUZZ_HARNESS(tokenizer_json) {
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 3);
  const std::string config = parts.size() > 1 ? std::string(parts[1]) : std::string();
  auto tok = ax::parse_hf_tokenizer(std::string(parts[0]), "tokenizer.json", config);
  const int64_t vocab = tok->vocab_size();
  if (vocab < 0 || tok->bos_id() >= vocab || tok->eos_id() >= vocab || tok->pad_id() >= vocab) std::abort();
  if (parts.size() < 3) return;
  const std::string text(parts[2]);
  for (bool special : {false, true}) {
    auto ids = tok->encode(text, special);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) std::abort();  // every id must index the embedding table
    (void)tok->decode(ids, false);
    (void)tok->decode(ids, true);
  }
  (void)tok->fingerprint();
}
