// The pipeline stages of an HF tokenizer.json, each parsed from its JSON and applied the way HF `tokenizers`
// applies it: normalizer -> pre-tokenizer -> (model) -> post-processor; decoder on the way back.
// Offsets are not tracked (we only need ids), except whether a piece starts at the beginning of the input,
// which Metaspace's prepend_scheme "first" depends on.
// Implementations: normalizers.cpp, pre_tokenizers.cpp, decoders.cpp, post_processors.cpp (helpers: split.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_reader.hpp"

namespace ax::tok {

// A span of the input on its way through the pipeline. `id` >= 0 once it is already a token (an added token
// split out of the text); such pieces are left alone by every later stage.
struct Piece {
  std::string text;
  int32_t id = -1;
  bool at_origin = false;  // begins at offset 0 of the original text
};

struct Normalizer {
  // Output may grow to kGrowth times the input plus kSlack bytes: enough for any real normalizer (NFKD
  // expands a character at most 18-fold), while a chain of Replace steps that doubles the text at each one
  // is stopped before it allocates gigabytes. Throws std::length_error past the limit.
  static constexpr std::size_t kGrowth = 64, kSlack = std::size_t{1} << 20;

  virtual ~Normalizer() = default;
  void normalize(std::string& text) const { apply(text, kGrowth * text.size() + kSlack); }
  // Normalizes `text` in place; the result (and every intermediate of a Sequence) stays within `max_size`.
  virtual void apply(std::string& text, std::size_t max_size) const = 0;
};

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  // Splits every piece that is not yet a token; drops empty pieces.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

struct Decoder {
  virtual ~Decoder() = default;
  // HF's decode_chain: token strings in, (fewer) strings out; the caller concatenates the result.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

struct PostProcessor {
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
  // The special tokens added before / after the sequence for a single input, or -1 (for bos_id()/eos_id()).
  virtual int32_t leading_special() const { return -1; }
  virtual int32_t trailing_special() const { return -1; }
};

// Each returns nullptr for a JSON null; throws UsageError naming file and path for anything unsupported.
std::unique_ptr<Normalizer> parse_normalizer(const JsonReader& r, const json& j, const std::string& path);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonReader& r, const json& j, const std::string& path);
std::unique_ptr<Decoder> parse_decoder(const JsonReader& r, const json& j, const std::string& path);
std::unique_ptr<PostProcessor> parse_post_processor(const JsonReader& r, const json& j, const std::string& path);

}  // namespace ax::tok
