// Arbitrary text (and ids) through the real tokenizers of the test models: byte-level BPE (Qwen2, Llama 3,
// GPT-2 style) and Metaspace with byte fallback (Llama 2, Mistral). Dataset rows are user text, so encoding
// must take any bytes, valid UTF-8 or not.
//
// Input: first byte picks the tokenizer and whether special tokens are added; the rest is the text. The same
// bytes, read as little-endian 16-bit ids, are decoded too (decode gets ids from generation, which can
// exceed the tokenizer's vocabulary when the model's embedding is padded).
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "axengine/hf_tokenizer.hpp"
#include "harness.hpp"

namespace {

const std::vector<std::unique_ptr<ax::Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<ax::Tokenizer>> v;
    for (const char* name : {"qwen2_bytelevel", "llama3_bytelevel", "llama2_metaspace", "mistral_metaspace_unk",
                             "gpt2_bytelevel_variant", "metaspace_split_variant", "split_behaviors_variant",
                             "axengine_bytelevel"}) {
      const std::string dir = std::string(AXENGINE_TEST_DATA_DIR) + "/tokenizers/" + name;
      try {
        v.push_back(ax::load_hf_tokenizer(dir));
      } catch (const std::exception& e) {
        ax::fuzz::setup_failed(dir.c_str(), e);
      }
    }
    return v;
  }();
  return all;
}

}  // namespace

AX_FUZZ_HARNESS(tokenizer_encode) {
  if (size == 0) return;
  const auto& all = tokenizers();
  const ax::Tokenizer& tok = *all[(data[0] >> 1) % all.size()];
  const bool special = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const int64_t vocab = tok.vocab_size();
  auto ids = tok.encode(text, special);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) std::abort();
  (void)tok.decode(ids, false);
  std::vector<int32_t> raw;
  for (std::size_t i = 1; i + 1 < size; i += 2)
    raw.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)));  // 0..65535: in and beyond the vocabulary
  (void)tok.decode(raw, special);
}
