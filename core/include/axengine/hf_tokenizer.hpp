// Hugging Face `tokenizer.json` support: loading a tokenizer as HF `tokenizers` would run it, and writing a
// minimal byte-level BPE tokenizer.json for freshly initialised models.
//
// Supported (everything else is refused with a UsageError naming the file and JSON path):
//   model          BPE (vocab, merges as "a b" strings or [a, b] pairs, unk_token, fuse_unk, byte_fallback,
//                  ignore_merges, continuing_subword_prefix, end_of_word_suffix; dropout must be null/0)
//   normalizer     NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence
//   pre_tokenizer  ByteLevel, Split, Metaspace, Digits, Sequence
//   post_processor TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence
//   decoder        ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence
// That covers Qwen2/3 and Llama 3 (byte-level) and Llama 2 / Mistral / Mixtral (Metaspace, byte fallback).
// Behaviour follows HF tokenizers 0.23 (checked by tests/unit/tokenizer_parity_test.cpp), including its quirks:
// added tokens are split out before normalization, ids HF does not know are skipped by decode, and
// add_special_tokens does exactly what the post_processor says (tokenizer_config's add_bos_token is not read).
// vocab_size() is one more than the largest id of the model vocabulary and the added tokens.
#pragma once
#include <memory>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "axengine/tokenizer.hpp"

namespace ax {

// `dir_or_file` is a model directory holding tokenizer.json (and optionally tokenizer_config.json, which names
// the bos/eos/pad tokens) or the path of a tokenizer.json itself. Without tokenizer_config.json, bos/eos come
// from the post-processor's template (a special token before / after $A).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir_or_file);

// Parses tokenizer.json text already in memory; `source` names it in error messages and `config_json`
// is tokenizer_config.json's text or "".
std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& tokenizer_json, const std::string& source,
                                              const std::string& config_json = "");

// encode(text, add_special_tokens = false) with, for each token, the byte range [begin, end) of `text` it came
// from (HF's offsets, in bytes, each widened to whole UTF-8 characters as HF's character offsets are). Exact
// when the normalizer leaves the text unchanged (NFC/NFKC on text already in that form, no normalizer);
// monotone and within the right added-token piece otherwise. A tokenizer other than load_hf_tokenizer's is a
// UsageError. Used to turn byte spans of a rendered chat into a token mask (the chat_template dataset type).
std::vector<int32_t> encode_with_offsets(const Tokenizer& tokenizer, const std::string& text,
                                         std::vector<std::pair<std::size_t, std::size_t>>& offsets);

// A Qwen-style byte-level BPE tokenizer: NFC, the Qwen2 split regex, ByteLevel, ids 0..255 for the bytes (in
// byte order), then learned merges, then the special tokens in the order given.
struct ByteLevelTokenizerOptions {
  std::vector<std::string> special_tokens{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"};
  std::string bos_token;  // "" = none (Qwen has none)
  std::string eos_token = "<|endoftext|>";
  std::string pad_token = "<|pad|>";
  // Merges are learned from `corpus` (greedy most-frequent-pair BPE) until `num_merges` exist or no pair
  // occurs twice. 0 keeps a pure byte vocabulary.
  std::vector<std::string> corpus;
  int num_merges = 0;
};

// tokenizer.json text (loadable by HF tokenizers and by load_hf_tokenizer).
std::string make_byte_level_tokenizer_json(const ByteLevelTokenizerOptions& options);
// The matching tokenizer_config.json text (bos/eos/pad names, added-token table).
std::string make_byte_level_tokenizer_config_json(const ByteLevelTokenizerOptions& options);
// Writes both into the existing directory `dir` (RuntimeError naming the file when it cannot).
void write_byte_level_tokenizer(const std::string& dir, const ByteLevelTokenizerOptions& options);

}  // namespace ax
