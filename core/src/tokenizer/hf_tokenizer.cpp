// ax::Tokenizer for HF tokenizer.json: added tokens are split out first (raw ones on the original text,
// "normalized" ones after normalization, as HF's AddedVocabulary does), then normalizer -> pre-tokenizer ->
// BPE -> post-processor. Decoding maps ids back to token strings and runs the decoder chain.
#include "axengine/hf_tokenizer.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <new>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "tokenizer/bpe.hpp"
#include "tokenizer/components.hpp"
#include "tokenizer/unicode.hpp"

namespace ax {
namespace tok {
namespace {

struct AddedToken {
  int32_t id;
  std::string content;
  std::string text;  // what decode emits: HF stores a normalized token's content normalized
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest matching of added tokens (what HF's Aho-Corasick with LeftmostLongest finds), a byte trie.
class TokenTrie {
 public:
  void insert(const std::string& pattern, std::size_t token) {
    if (pattern.empty()) return;
    std::size_t node = 0;
    for (unsigned char c : pattern) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, terminal_.size()).first;
        terminal_.push_back(-1);
      }
      node = it->second;
    }
    terminal_[node] = static_cast<int64_t>(token);
  }
  bool empty() const { return edges_.empty(); }
  // The longest pattern starting at text[pos]: (token index, length), or token -1.
  std::pair<int64_t, std::size_t> longest_at(std::string_view text, std::size_t pos) const {
    std::pair<int64_t, std::size_t> best{-1, 0};
    std::size_t node = 0;
    for (std::size_t i = pos; i < text.size(); ++i) {
      auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]));
      if (it == edges_.end()) break;
      node = it->second;
      if (terminal_[node] >= 0) best = {terminal_[node], i + 1 - pos};
    }
    return best;
  }

 private:
  std::unordered_map<uint64_t, std::size_t> edges_;
  std::vector<int64_t> terminal_{-1};  // node 0 is the root
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return is_alphanumeric(next_code_point(s, i));
}
bool starts_with_word(std::string_view s) {
  std::size_t i = 0;
  return !s.empty() && is_alphanumeric(next_code_point(s, i));
}
// Where the run of trailing whitespace of `s` begins (HF's space_leftmost_at_end).
std::size_t trailing_space_start(std::string_view s) {
  std::size_t start = s.size();
  while (start > 0) {
    std::size_t b = start - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    std::size_t i = b;
    if (!is_whitespace(next_code_point(s, i))) break;
    start = b;
  }
  return start;
}
// Length of the run of leading whitespace of `s` (HF's space_rightmost_at_start).
std::size_t leading_space_length(std::string_view s) {
  std::size_t end = 0;
  while (end < s.size()) {
    std::size_t i = end;
    if (!is_whitespace(next_code_point(s, i))) break;
    end = i;
  }
  return end;
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& tokenizer_json, const std::string& source, const std::string& config_json,
              const std::string& config_source);

  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  std::string fingerprint() const override { return fingerprint_; }
  std::vector<int32_t> encode_offsets(const std::string& text, std::vector<std::pair<std::size_t, std::size_t>>& offsets) const;

 private:
  std::string surface(int32_t id) const;
  void split_added(std::vector<Piece>& pieces, const TokenTrie& trie) const;
  void normalize(std::string& text) const;
  int32_t resolve_config_token(const JsonReader& r, const json& config, const char* key) const;

  std::string source_;
  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, std::size_t> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  TokenTrie raw_trie_, normalized_trie_;
  int64_t vocab_size_ = 0;
  int32_t bos_id_ = -1, eos_id_ = -1, pad_id_ = -1;
  bool byte_level_ = false;  // a ByteLevel pre-tokenizer: token strings are stand-in characters of bytes
  std::string fingerprint_;
};

std::string fnv1a_hex(std::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw UsageError(source + ": is not valid JSON (" + e.what() + ")");
  }
}

HfTokenizer::HfTokenizer(const std::string& tokenizer_json, const std::string& source,
                         const std::string& config_json, const std::string& config_source)
    : source_(source) {
  const JsonReader r{source};
  const json root = parse_json_text(tokenizer_json, source);
  r.object(root, "(top level)");

  model_ = std::make_unique<Bpe>(r, r.required(root, "model", ""), "model");
  normalizer_ = parse_normalizer(r, root.value("normalizer", json()), "normalizer");
  pre_tokenizer_ = parse_pre_tokenizer(r, root.value("pre_tokenizer", json()), "pre_tokenizer");
  post_processor_ = parse_post_processor(r, root.value("post_processor", json()), "post_processor");
  decoder_ = parse_decoder(r, root.value("decoder", json()), "decoder");

  byte_level_ = root.contains("pre_tokenizer") && root["pre_tokenizer"].dump().find("\"ByteLevel\"") != std::string::npos;
  vocab_size_ = model_->max_id() + 1;
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& list = r.array(root["added_tokens"], "added_tokens");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string ip = JsonReader::index("added_tokens", i);
      const json& t = r.object(list[i], ip);
      AddedToken a;
      a.content = r.string(t, "content", ip);
      if (a.content.empty()) r.fail(ip + ".content", "must not be empty");
      if (valid_utf8_prefix(a.content) != a.content.size()) r.fail(ip + ".content", "is not valid UTF-8");
      // HF keeps the model's id for a token the vocabulary already has.
      a.id = model_->token_to_id(a.content).value_or(r.id(r.required(t, "id", ip), ip + ".id"));
      a.single_word = r.boolean(t, "single_word", ip, false);
      a.lstrip = r.boolean(t, "lstrip", ip, false);
      a.rstrip = r.boolean(t, "rstrip", ip, false);
      a.special = r.boolean(t, "special", ip, false);
      a.normalized = r.boolean(t, "normalized", ip, !a.special);
      added_by_id_[a.id] = added_.size();
      added_by_content_[a.content] = a.id;
      vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{a.id} + 1);
      added_.push_back(std::move(a));
    }
  }
  for (std::size_t k = 0; k < added_.size(); ++k) {
    if (added_[k].normalized) {
      // HF matches normalized added tokens against normalized text, so it normalizes their content too (and
      // then decodes them from that normalized form).
      added_[k].text = added_[k].content;
      if (normalizer_) normalize(added_[k].text);
      normalized_trie_.insert(added_[k].text, k);
    } else {
      added_[k].text = added_[k].content;
      raw_trie_.insert(added_[k].content, k);
    }
  }

  // bos/eos/pad: tokenizer_config.json names them; otherwise the template's leading/trailing special token.
  json config;
  if (!config_json.empty()) {
    config = parse_json_text(config_json, config_source);
    JsonReader(config_source).object(config, "(top level)");
  }
  const JsonReader cr{config_source};
  bos_id_ = resolve_config_token(cr, config, "bos_token");
  eos_id_ = resolve_config_token(cr, config, "eos_token");
  pad_id_ = resolve_config_token(cr, config, "pad_token");
  if (post_processor_ && !config.contains("bos_token")) bos_id_ = post_processor_->leading_special();
  if (post_processor_ && !config.contains("eos_token")) eos_id_ = post_processor_->trailing_special();

  // Our own version tag first: a change of behaviour here must also invalidate prepared-data caches.
  std::string canonical = "axengine-hf-tokenizer-1\n" + root.dump() + "\n";
  for (const char* key : {"bos_token", "eos_token", "pad_token"})
    canonical += config.contains(key) ? config[key].dump() + "\n" : "null\n";
  fingerprint_ = fnv1a_hex(canonical);
}

int32_t HfTokenizer::resolve_config_token(const JsonReader& r, const json& config, const char* key) const {
  if (!config.is_object()) return -1;
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return -1;
  std::string name;
  if (it->is_object()) {
    name = r.string(*it, "content", key);
  } else {
    name = r.string(*it, key);
  }
  if (auto a = added_by_content_.find(name); a != added_by_content_.end()) return a->second;
  if (auto id = model_->token_to_id(name)) return *id;
  r.fail(key, "'" + name + "' is neither an added token nor in the vocabulary of " + source_);
}

// The normalizer comes from the file: one that blows the text up (Replace steps that each double it) is
// stopped at its size limit, or by the allocator, and either way the error names the file.
void HfTokenizer::normalize(std::string& text) const {
  const std::size_t input = text.size();
  try {
    normalizer_->normalize(text);
  } catch (const std::length_error& e) {
    throw UsageError(source_ + ": normalizer: " + e.what() + " from an input of " + std::to_string(input) +
                     " bytes; a normalizer that multiplies the text is not supported");
  } catch (const std::bad_alloc&) {
    throw UsageError(source_ + ": normalizer ran out of memory on an input of " + std::to_string(input) + " bytes");
  }
}

void HfTokenizer::split_added(std::vector<Piece>& pieces, const TokenTrie& trie) const {
  if (trie.empty()) return;
  std::vector<Piece> out;
  for (auto& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    const std::string_view s = p.text;
    std::size_t emitted = 0;  // end of what is already in `out`
    for (std::size_t pos = 0; pos < s.size();) {
      const auto [k, len] = trie.longest_at(s, pos);
      if (k < 0) {
        pos += utf8_length(static_cast<unsigned char>(s[pos]));
        continue;
      }
      const AddedToken& a = added_[static_cast<std::size_t>(k)];
      std::size_t start = pos, stop = pos + len;
      pos = stop;  // a discarded match is still consumed, as in HF's non-overlapping find_iter
      if (a.single_word &&
          ((start > 0 && ends_with_word(s.substr(0, start))) || (stop < s.size() && starts_with_word(s.substr(stop)))))
        continue;
      if (a.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), emitted);
      if (a.rstrip) stop += leading_space_length(s.substr(stop));
      if (emitted < start) out.push_back({std::string(s.substr(emitted, start - emitted)), -1, p.at_origin && emitted == 0});
      out.push_back({std::string(s.substr(start, stop - start)), a.id, false});
      emitted = stop;
      pos = std::max(pos, stop);
    }
    if (emitted < s.size()) out.push_back({std::string(s.substr(emitted)), -1, p.at_origin && emitted == 0});
  }
  pieces = std::move(out);
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  if (const std::size_t valid = valid_utf8_prefix(text); valid != text.size())
    throw UsageError("tokenizer input is not valid UTF-8 (byte " + std::to_string(valid) + ")");
  std::vector<Piece> pieces{{text, -1, true}};
  split_added(pieces, raw_trie_);
  if (normalizer_)
    for (auto& p : pieces)
      if (p.id < 0) normalize(p.text);
  split_added(pieces, normalized_trie_);
  std::erase_if(pieces, [](const Piece& p) { return p.id < 0 && p.text.empty(); });
  if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const auto& p : pieces) {
    if (p.id >= 0) {
      ids.push_back(p.id);
    } else {
      model_->tokenize(p.text, ids);
    }
  }
  if (post_processor_) post_processor_->process(ids, add_special_tokens);
  return ids;
}

// The text a token stands for, in bytes of the input: byte-level stand-ins turned back into their bytes;
// otherwise SentencePiece's U+2581 as a space and a byte-fallback token <0xXX> as its byte. An added token is
// its content. Used only to align tokens with the input (encode_offsets), never to decode.
std::string HfTokenizer::surface(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  const std::string* token = model_->id_to_token(id);
  if (!token) return "";
  const std::string& t = *token;
  std::string out;
  if (byte_level_) {
    const auto& alphabet = byte_level_alphabet();
    for (std::size_t i = 0; i < t.size();) {
      const char32_t c = next_code_point(t, i);
      if (c >= alphabet.char_to_byte.size() || alphabet.char_to_byte[c] < 0) return t;
      out += static_cast<char>(alphabet.char_to_byte[c]);
    }
    return out;
  }
  if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
    const int v = std::stoi(t.substr(3, 2), nullptr, 16);  // vocabularies with byte fallback spell these in hex
    return std::string(1, static_cast<char>(v));
  }
  for (std::size_t i = 0; i < t.size();) {
    const std::size_t b = i;
    if (next_code_point(t, i) == U'\u2581') {
      out += ' ';
    } else {
      out.append(t, b, i - b);
    }
  }
  return out;
}

// Offsets: the input is split at raw added tokens (pieces that partition it exactly), each piece runs through
// the rest of the pipeline alone (as in encode, which treats pieces independently), and the tokens' surfaces
// are aligned with the piece's original bytes: a matching byte advances both, a surface space the input lacks
// (Metaspace's prepended U+2581) advances only the surface, any other mismatch (text the normalizer changed)
// consumes one input character. Exact when normalization leaves the piece unchanged; monotone and within the
// piece otherwise. Spans are widened to whole UTF-8 characters, as HF's (character) offsets are.
std::vector<int32_t> HfTokenizer::encode_offsets(const std::string& text,
                                                 std::vector<std::pair<std::size_t, std::size_t>>& offsets) const {
  if (const std::size_t valid = valid_utf8_prefix(text); valid != text.size())
    throw UsageError("tokenizer input is not valid UTF-8 (byte " + std::to_string(valid) + ")");
  std::vector<Piece> raw{{text, -1, true}};
  split_added(raw, raw_trie_);
  std::vector<int32_t> ids;
  offsets.clear();
  std::size_t base = 0;
  for (auto& p : raw) {
    const std::size_t begin = base, end = base + p.text.size();
    base = end;
    if (p.id >= 0) {
      ids.push_back(p.id);
      offsets.emplace_back(begin, end);
      continue;
    }
    std::vector<Piece> pieces{{p.text, -1, p.at_origin}};
    if (normalizer_) normalize(pieces[0].text);
    split_added(pieces, normalized_trie_);
    std::erase_if(pieces, [](const Piece& q) { return q.id < 0 && q.text.empty(); });
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    const std::size_t first = ids.size();
    for (const auto& q : pieces) {
      if (q.id >= 0) {
        ids.push_back(q.id);
      } else {
        model_->tokenize(q.text, ids);
      }
    }
    std::size_t i = begin;
    auto next_char = [&](std::size_t at) { return at + std::min(utf8_length(static_cast<unsigned char>(text[at])), end - at); };
    const std::optional<int32_t> unk = model_->unk_id();
    for (std::size_t k = first; k < ids.size(); ++k) {
      const std::size_t start = i;
      if (unk && ids[k] == *unk) {
        // The unknown text is one character, or (fuse_unk) the run up to where the next token's text starts.
        const std::string next = k + 1 < ids.size() && ids[k + 1] != *unk ? surface(ids[k + 1]) : "";
        if (i < end) i = next_char(i);
        while (!next.empty() && i < end && text[i] != next[0] && !(next[0] == ' ' && k + 1 == first)) i = next_char(i);
        offsets.emplace_back(start, i);
        continue;
      }
      for (char c : surface(ids[k])) {
        if (i < end && text[i] == c) {
          ++i;
        } else if (c != ' ' && i < end) {
          i = next_char(i);
        }
      }
      // A token of inserted text only (Metaspace's prepended U+2581 alone): HF gives it the character it precedes.
      if (i == start && i < end) {
        offsets.emplace_back(i, next_char(i));
        continue;
      }
      offsets.emplace_back(start, i);
    }
    if (ids.size() > first) offsets.back().second = end;  // input the surfaces did not cover (stripped)
  }
  for (auto& [b, e] : offsets) {
    while (b > 0 && b < text.size() && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
    while (e < text.size() && (static_cast<unsigned char>(text[e]) & 0xC0) == 0x80) ++e;
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (skip_special_tokens && added_[it->second].special) continue;
      token = &added_[it->second].text;
    } else {
      token = model_->id_to_token(id);
    }
    if (!token) continue;  // HF skips ids it does not know
    tokens.push_back(*token);
  }
  if (!decoder_) {
    std::string joined;
    for (std::size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder_->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string read_file(const std::string& path) { return read_regular_file(path); }

}  // namespace
}  // namespace tok

namespace {

// Building a tokenizer from a hostile file can exhaust memory (a huge vocabulary or normalizer): say which file.
template <class F>
std::unique_ptr<Tokenizer> naming_file_on_oom(const std::string& source, F&& build) {
  try {
    return build();
  } catch (const std::bad_alloc&) {
    throw UsageError(source + ": ran out of memory while loading the tokenizer (is the file what it claims to be?)");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& tokenizer_json, const std::string& source,
                                              const std::string& config_json) {
  return naming_file_on_oom(source, [&] {
    return std::make_unique<tok::HfTokenizer>(tokenizer_json, source, config_json, "tokenizer_config.json");
  });
}

std::vector<int32_t> encode_with_offsets(const Tokenizer& tokenizer, const std::string& text,
                                         std::vector<std::pair<std::size_t, std::size_t>>& offsets) {
  const auto* hf = dynamic_cast<const tok::HfTokenizer*>(&tokenizer);
  if (!hf) throw UsageError("token offsets need a tokenizer.json tokenizer; this one is another kind");
  return hf->encode_offsets(text, offsets);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir_or_file) {
  // POSIX stat rather than std::filesystem: the torch wheel's libtorch.so exports its own (broken) copies of
  // some std::filesystem functions, which can win symbol resolution.
  struct stat st {};
  if (::stat(dir_or_file.c_str(), &st) != 0) throw UsageError(dir_or_file + ": not found");
  std::string file = dir_or_file;
  if (S_ISDIR(st.st_mode)) {
    file += (file.empty() || file.back() != '/') ? "/tokenizer.json" : "tokenizer.json";
    if (::stat(file.c_str(), &st) != 0)
      throw UsageError(file + ": not found (a model directory needs a tokenizer.json)");
  }
  const std::size_t slash = file.rfind('/');
  const std::string config = (slash == std::string::npos ? std::string() : file.substr(0, slash + 1)) +
                             "tokenizer_config.json";
  const std::string config_text = ::stat(config.c_str(), &st) == 0 ? tok::read_file(config) : "";
  return naming_file_on_oom(file, [&] { return std::make_unique<tok::HfTokenizer>(tok::read_file(file), file, config_text, config); });
}

}  // namespace ax
