// Writes a Qwen-style byte-level BPE tokenizer.json (and its tokenizer_config.json) for freshly initialised
// models, optionally with merges learned from a small corpus by plain greedy BPE training.
#include <fstream>
#include <map>
#include <set>

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "tokenizer/json_reader.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace ax {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void validate(const ByteLevelTokenizerOptions& o) {
  std::set<std::string> seen;
  for (const auto& t : o.special_tokens) {
    if (t.empty()) throw UsageError("byte-level tokenizer: a special token is empty");
    if (tok::valid_utf8_prefix(t) != t.size()) throw UsageError("byte-level tokenizer: special token is not UTF-8");
    if (!seen.insert(t).second) throw UsageError("byte-level tokenizer: special token '" + t + "' is listed twice");
  }
  for (const auto* name : {&o.bos_token, &o.eos_token, &o.pad_token})
    if (!name->empty() && !seen.count(*name))
      throw UsageError("byte-level tokenizer: '" + *name + "' must also be one of the special tokens");
  if (o.num_merges < 0) throw UsageError("byte-level tokenizer: num_merges must not be negative");
}

// Greedy BPE over the pre-tokenized corpus: repeatedly merge the most frequent adjacent pair (ties: the
// lexicographically smallest pair, so the result is deterministic). Returns merges as token-string pairs.
std::vector<std::pair<std::string, std::string>> learn_merges(const ByteLevelTokenizerOptions& o) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (o.num_merges == 0 || o.corpus.empty()) return merges;
  const auto& alphabet = tok::byte_level_alphabet();
  const tok::Regex split(kQwen2Pattern);
  std::map<std::string, int64_t> word_counts;
  for (const auto& line : o.corpus) {
    if (tok::valid_utf8_prefix(line) != line.size()) throw UsageError("byte-level tokenizer: corpus is not UTF-8");
    const std::string text = tok::normalize(line, tok::NormalForm::NFC);
    for (auto [b, e] : split.find_all(text)) ++word_counts[text.substr(b, e - b)];
  }
  std::vector<std::string> names;  // symbol id -> token string
  std::map<std::string, int32_t> ids;
  auto intern = [&](const std::string& s) {
    auto [it, inserted] = ids.emplace(s, static_cast<int32_t>(names.size()));
    if (inserted) names.push_back(s);
    return it->second;
  };
  for (int b = 0; b < 256; ++b) intern(alphabet.byte_to_utf8[b]);
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, count] : word_counts) {
    Word word{{}, count};
    for (unsigned char c : w) word.symbols.push_back(c);
    words.push_back(std::move(word));
  }
  while (static_cast<int>(merges.size()) < o.num_merges) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pair_counts;
    for (const auto& w : words)
      for (std::size_t i = 0; i + 1 < w.symbols.size(); ++i) pair_counts[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    const std::pair<int32_t, int32_t>* best = nullptr;
    int64_t best_count = 1;  // a pair seen once is not worth a token
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count ||
          (count == best_count && best &&
           std::tie(names[pair.first], names[pair.second]) < std::tie(names[best->first], names[best->second]))) {
        best = &pair;
        best_count = count;
      }
    }
    if (!best) break;
    const auto [a, b] = *best;
    merges.emplace_back(names[a], names[b]);
    const int32_t merged = intern(names[a] + names[b]);
    for (auto& w : words) {
      std::vector<int32_t> out;
      out.reserve(w.symbols.size());
      for (std::size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == a && w.symbols[i + 1] == b) {
          out.push_back(merged);
          ++i;
        } else {
          out.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(out);
    }
  }
  return merges;
}

ordered_json byte_level_component() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

}  // namespace

std::string make_byte_level_tokenizer_json(const ByteLevelTokenizerOptions& o) {
  validate(o);
  const auto& alphabet = tok::byte_level_alphabet();
  const auto merges = learn_merges(o);

  ordered_json vocab = ordered_json::object();
  int32_t next_id = 0;
  for (int b = 0; b < 256; ++b) vocab[alphabet.byte_to_utf8[b]] = next_id++;
  ordered_json merge_list = ordered_json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next_id++;
    merge_list.push_back({a, b});
  }
  ordered_json added = ordered_json::array();
  std::map<std::string, int32_t> special_ids;
  for (const auto& t : o.special_tokens) {
    special_ids[t] = next_id;
    added.push_back({{"id", next_id++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }

  ordered_json post = byte_level_component();
  if (!o.bos_token.empty()) {
    auto special = [](const std::string& id, int type_id) {
      return ordered_json{{"SpecialToken", {{"id", id}, {"type_id", type_id}}}};
    };
    auto sequence = [](const char* id, int type_id) {
      return ordered_json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
    };
    ordered_json tmpl = {
        {"type", "TemplateProcessing"},
        {"single", {special(o.bos_token, 0), sequence("A", 0)}},
        {"pair", {special(o.bos_token, 0), sequence("A", 0), special(o.bos_token, 1), sequence("B", 1)}},
        {"special_tokens",
         {{o.bos_token, {{"id", o.bos_token}, {"ids", {special_ids[o.bos_token]}}, {"tokens", {o.bos_token}}}}}}};
    post = {{"type", "Sequence"}, {"processors", {byte_level_component(), tmpl}}};
  }

  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = added;
  root["normalizer"] = {{"type", "NFC"}};
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        byte_level_component()}}};
  root["post_processor"] = post;
  root["decoder"] = byte_level_component();
  root["model"] = {{"type", "BPE"},           {"dropout", nullptr},     {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},            {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},       {"byte_fallback", false}, {"ignore_merges", false},
                   {"vocab", vocab},          {"merges", merge_list}};
  return root.dump(2, ' ', false) + "\n";
}

std::string make_byte_level_tokenizer_config_json(const ByteLevelTokenizerOptions& o) {
  // The ids come from the tokenizer.json itself, so the two files cannot disagree.
  const auto tokenizer = nlohmann::json::parse(make_byte_level_tokenizer_json(o));
  ordered_json decoder = ordered_json::object();
  for (const auto& t : tokenizer["added_tokens"])
    decoder[std::to_string(t["id"].get<int64_t>())] = {
        {"content", t["content"]}, {"lstrip", false}, {"normalized", false},
        {"rstrip", false},         {"single_word", false}, {"special", true}};
  auto name = [](const std::string& s) { return s.empty() ? ordered_json(nullptr) : ordered_json(s); };
  ordered_json root;
  root["added_tokens_decoder"] = decoder;
  root["bos_token"] = name(o.bos_token);
  root["eos_token"] = name(o.eos_token);
  root["pad_token"] = name(o.pad_token);
  root["clean_up_tokenization_spaces"] = false;
  root["model_max_length"] = 131072;
  root["tokenizer_class"] = "PreTrainedTokenizerFast";
  return root.dump(2, ' ', false) + "\n";
}

void write_byte_level_tokenizer(const std::string& dir, const ByteLevelTokenizerOptions& o) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  for (const auto& [file, text] : {std::pair{std::string("tokenizer.json"), make_byte_level_tokenizer_json(o)},
                                   std::pair{std::string("tokenizer_config.json"),
                                             make_byte_level_tokenizer_config_json(o)}}) {
    std::ofstream out(base + file, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw RuntimeError(base + file + ": cannot be written");
  }
}

}  // namespace ax
