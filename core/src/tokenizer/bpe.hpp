// The BPE model of HF tokenizers: a word is split into characters (or byte-fallback / unk tokens), then
// merged pairwise by merge rank with a priority queue (O(n log n) per word, like HF's Word::merge_all).
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_reader.hpp"

namespace ax::tok {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Merge lookup is the hot loop of encoding: an open-addressing table keyed by the (left id, right id) pair,
// about 3x faster than std::unordered_map here.
class MergeTable {
 public:
  struct Target {
    int32_t rank, new_id;
  };
  void reserve(std::size_t n);
  void insert_or_assign(uint64_t key, Target value);
  const Target* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of valid ids (both < 2^31) maps here
  std::size_t slot(uint64_t key) const { return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_); }
  std::vector<uint64_t> keys_;
  std::vector<Target> values_;
  std::size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

class Bpe {
 public:
  // Parses tokenizer.json's "model" object (`path` is its JSON path, for errors).
  Bpe(const JsonReader& r, const json& model, const std::string& path);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id is not in the vocabulary
  std::optional<int32_t> unk_id() const { return unk_id_; }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  using MergeTarget = MergeTable::Target;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::string source_;  // for the unk error
  Vocab vocab_;
  std::vector<const std::string*> id_to_token_;
  MergeTable merges_;
  std::optional<std::string> unk_token_;
  std::optional<int32_t> unk_id_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> tokens, -1 when absent

  // Word cache, as HF keeps one: bounded, never evicts (only speed depends on it).
  static constexpr std::size_t kCacheCapacity = 50000, kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace ax::tok
