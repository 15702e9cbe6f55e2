#include "tokenizer/components.hpp"

#include <functional>
#include <optional>
#include <stdexcept>

#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace ax::tok {
namespace {

// ---------------------------------------------------------------- shared pieces

// HF's {"String": s} / {"Regex": r} pattern, compiled (a string is matched literally).
std::unique_ptr<Regex> parse_pattern(const JsonReader& r, const json& j, const std::string& path) {
  r.object(j, path);
  try {
    if (j.contains("String")) return std::make_unique<Regex>(Regex::escape(r.string(j, "String", path)));
    if (j.contains("Regex")) return std::make_unique<Regex>(r.string(j, "Regex", path));
  } catch (const std::invalid_argument& e) {
    r.fail(path, e.what());
  }
  r.fail(path, "must be {\"String\": ...} or {\"Regex\": ...}");
}

char32_t parse_char(const JsonReader& r, const json& j, const std::string& key, const std::string& path) {
  const std::string s = r.string(j, key, path);
  std::size_t i = 0;
  if (s.empty() || valid_utf8_prefix(s) != s.size()) r.fail(JsonReader::join(path, key), "must be one character");
  const char32_t c = next_code_point(s, i);
  if (i != s.size()) r.fail(JsonReader::join(path, key), "must be one character, got '" + s + "'");
  return c;
}

// A segment of a string and whether the splitting pattern matched it (HF's find_matches output: the segments
// cover the whole string in order).
struct Segment {
  std::size_t begin, end;
  bool is_match;
};

std::vector<Segment> segments_from_matches(const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                                           std::size_t size) {
  std::vector<Segment> out;
  if (size == 0) return {{0, 0, false}};
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != size) out.push_back({prev, size, false});
  return out;
}

// Every single character satisfying `pred` is its own match (HF's Pattern for Fn(char) -> bool).
std::vector<Segment> segments_by_char(std::string_view s, const std::function<bool(char32_t)>& pred) {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t b = i;
    if (pred(next_code_point(s, i))) matches.emplace_back(b, i);
  }
  return segments_from_matches(matches, s.size());
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const JsonReader& r, const json& j, const std::string& path) {
  const std::string b = r.string(j, "behavior", path);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  r.fail(JsonReader::join(path, "behavior"), "'" + b + "' is not a split behavior");
}

// HF NormalizedString::split: which [begin, end) ranges survive for a given behavior.
std::vector<std::pair<std::size_t, std::size_t>> apply_behavior(const std::vector<Segment>& segs, Behavior behavior) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (const auto& s : segs) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::Removed:
      for (const auto& s : segs)
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::Contiguous:
      for (const auto& s : segs) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::MergedWithPrevious:
      for (const auto& s : segs) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

// Replaces every piece that is not yet a token by the non-empty pieces `split` makes of it.
void split_pieces(std::vector<Piece>& pieces,
                  const std::function<void(Piece&, std::vector<Piece>&)>& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (auto& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    split(p, out);
  }
  pieces.clear();
  for (auto& p : out)
    if (!p.text.empty() || p.id >= 0) pieces.push_back(std::move(p));
}

void emit_ranges(const Piece& p, const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                 std::vector<Piece>& out) {
  for (auto [b, e] : ranges)
    if (e > b) out.push_back({p.text.substr(b, e - b), -1, p.at_origin && b == 0});
}

std::string replace_all(const std::string& text, const Regex& pattern, const std::string& content) {
  const auto matches = pattern.find_all(text);
  if (matches.empty()) return text;
  std::string out;
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  return out;
}

// ---------------------------------------------------------------- normalizers

struct UnicodeNormalizer : Normalizer {
  NormalForm form;
  explicit UnicodeNormalizer(NormalForm f) : form(f) {}
  void normalize(std::string& text) const override { text = tok::normalize(text, form); }
};

struct PrependNormalizer : Normalizer {
  std::string prefix;
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix);
  }
};

struct ReplaceNormalizer : Normalizer {
  std::unique_ptr<Regex> pattern;
  std::string content;
  void normalize(std::string& text) const override { text = replace_all(text, *pattern, content); }
};

struct StripNormalizer : Normalizer {
  bool left = false, right = false;
  void normalize(std::string& text) const override {
    std::size_t begin = 0, end = text.size();
    if (left) {
      while (begin < text.size()) {
        std::size_t i = begin;
        if (!is_whitespace(next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right) {
      std::size_t last_non_space_end = begin;
      for (std::size_t i = begin; i < text.size();)
        if (!is_whitespace(next_code_point(text, i))) last_non_space_end = i;
      end = last_non_space_end;
    }
    text = text.substr(begin, end - begin);
  }
};

struct SequenceNormalizer : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> steps;
  void normalize(std::string& text) const override {
    for (const auto& s : steps) s->normalize(text);
  }
};

// ---------------------------------------------------------------- pre-tokenizers

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelPreTokenizer : PreTokenizer {
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // null when use_regex is false
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    const auto& alphabet = byte_level_alphabet();
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      if (add_prefix_space && p.text.rfind(' ', 0) != 0) p.text.insert(0, " ");
      const std::size_t first = out.size();
      if (regex) {
        emit_ranges(p, apply_behavior(segments_from_matches(regex->find_all(p.text), p.text.size()),
                                      Behavior::Isolated),
                    out);
      } else {
        out.push_back(std::move(p));
      }
      for (std::size_t k = first; k < out.size(); ++k) {
        std::string mapped;
        mapped.reserve(out[k].text.size() * 2);
        for (unsigned char b : out[k].text) mapped += alphabet.byte_to_utf8[b];
        out[k].text = std::move(mapped);
      }
    });
  }
};

struct SplitPreTokenizer : PreTokenizer {
  std::unique_ptr<Regex> pattern;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      auto segs = segments_from_matches(pattern->find_all(p.text), p.text.size());
      if (invert)
        for (auto& s : segs) s.is_match = !s.is_match;
      emit_ranges(p, apply_behavior(segs, behavior), out);
    });
  }
};

enum class PrependScheme { Always, Never, First };

PrependScheme parse_prepend_scheme(const JsonReader& r, const json& j, const std::string& path) {
  auto scheme = r.optional_string(j, "prepend_scheme", path);
  if (!scheme) return r.boolean(j, "add_prefix_space", path, true) ? PrependScheme::Always : PrependScheme::Never;
  if (*scheme == "always") return PrependScheme::Always;
  if (*scheme == "never") return PrependScheme::Never;
  if (*scheme == "first") return PrependScheme::First;
  r.fail(JsonReader::join(path, "prepend_scheme"), "'" + *scheme + "' is not one of always, never, first");
}

struct MetaspacePreTokenizer : PreTokenizer {
  char32_t replacement = U'\u2581';
  std::string replacement_utf8;
  PrependScheme scheme = PrependScheme::Always;
  bool split = true;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      std::string text;
      text.reserve(p.text.size() + replacement_utf8.size());
      for (char c : p.text) {
        if (c == ' ') {
          text += replacement_utf8;
        } else {
          text += c;
        }
      }
      const bool starts = text.rfind(replacement_utf8, 0) == 0;
      if (!starts && (scheme == PrependScheme::Always || (scheme == PrependScheme::First && p.at_origin)))
        text.insert(0, replacement_utf8);
      p.text = std::move(text);
      if (!split) {
        out.push_back(std::move(p));
        return;
      }
      const auto segs = segments_by_char(p.text, [&](char32_t c) { return c == replacement; });
      emit_ranges(p, apply_behavior(segs, Behavior::MergedWithNext), out);
    });
  }
};

struct DigitsPreTokenizer : PreTokenizer {
  bool individual = false;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      const auto segs = segments_by_char(p.text, is_numeric);
      emit_ranges(p, apply_behavior(segs, individual ? Behavior::Isolated : Behavior::Contiguous), out);
    });
  }
};

struct SequencePreTokenizer : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps) s->pre_tokenize(pieces);
  }
};

// ---------------------------------------------------------------- decoders

struct ByteLevelDecoder : Decoder {
  void decode_chain(std::vector<std::string>& tokens) const override {
    const auto& alphabet = byte_level_alphabet();
    std::string bytes;
    for (const auto& t : tokens) {
      // A token made only of stand-in characters turns back into its bytes; any other (an added token
      // such as "<x\n>") is passed through as it is.
      std::string mapped;
      bool all_mapped = true;
      for (std::size_t i = 0; i < t.size();) {
        const char32_t c = next_code_point(t, i);
        if (c >= alphabet.char_to_byte.size() || alphabet.char_to_byte[c] < 0) {
          all_mapped = false;
          break;
        }
        mapped += static_cast<char>(alphabet.char_to_byte[c]);
      }
      bytes += all_mapped ? mapped : t;
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

struct MetaspaceDecoder : Decoder {
  char32_t replacement = U'\u2581';
  PrependScheme scheme = PrependScheme::Always;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (std::size_t i = 0; i < t.size();) {
        const std::size_t b = i;
        const char32_t c = next_code_point(t, i);
        if (c != replacement) {
          out.append(t, b, i - b);
        } else if (!(k == 0 && scheme != PrependScheme::Never)) {
          out += ' ';  // HF drops every replacement of the first token, not only the leading one
        }
      }
      tokens[k] = std::move(out);
    }
  }
};

struct ReplaceDecoder : Decoder {
  std::unique_ptr<Regex> pattern;
  std::string content;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) t = replace_all(t, *pattern, content);
  }
};

struct ByteFallbackDecoder : Decoder {
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;  // bytes of consecutive <0xXX> tokens
    auto flush = [&] {
      if (pending.empty()) return;
      if (valid_utf8_prefix(pending) == pending.size()) {
        out.push_back(pending);
      } else {
        for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      int value = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) -> int {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          return -1;
        };
        const int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) value = hi * 16 + lo;
      }
      if (value >= 0) {
        pending += static_cast<char>(value);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

struct FuseDecoder : Decoder {
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

struct StripDecoder : Decoder {
  char32_t content = U' ';
  std::size_t start = 0, stop = 0;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<std::size_t, char32_t>> chars;  // (byte offset, code point)
      for (std::size_t i = 0; i < t.size();) {
        const std::size_t b = i;
        chars.emplace_back(b, next_code_point(t, i));
      }
      std::size_t start_cut = 0;
      for (std::size_t i = 0; i < std::min(start, chars.size()) && chars[i].second == content; ++i)
        start_cut = i + 1;
      std::size_t stop_cut = chars.size();
      for (std::size_t i = 0; i < std::min(stop, chars.size()); ++i) {
        const std::size_t index = chars.size() - i - 1;
        if (chars[index].second != content) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {
        t.clear();
        continue;
      }
      const std::size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
      const std::size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b, e - b);
    }
  }
};

struct SequenceDecoder : Decoder {
  std::vector<std::unique_ptr<Decoder>> steps;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps) s->decode_chain(tokens);
  }
};

// ---------------------------------------------------------------- post-processors

// The single-sequence template, as a list of items: token ids to insert, or the sequence itself (empty list).
struct TemplateProcessor : PostProcessor {
  std::vector<std::optional<std::vector<int32_t>>> items;  // nullopt = $A
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    for (const auto& item : items) {
      if (item) {
        out.insert(out.end(), item->begin(), item->end());
      } else {
        out.insert(out.end(), ids.begin(), ids.end());
      }
    }
    ids = std::move(out);
  }
  int32_t leading_special() const override {
    return !items.empty() && items.front() && items.front()->size() == 1 ? items.front()->front() : -1;
  }
  int32_t trailing_special() const override {
    return items.size() > 1 && items.back() && items.back()->size() == 1 ? items.back()->front() : -1;
  }
};

// ByteLevel's post-processor only trims offsets, which we do not track.
struct NoOpProcessor : PostProcessor {
  void process(std::vector<int32_t>&, bool) const override {}
};

struct SequenceProcessor : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> steps;
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& s : steps) s->process(ids, add_special_tokens);
  }
  int32_t leading_special() const override {
    for (const auto& s : steps)
      if (s->leading_special() >= 0) return s->leading_special();
    return -1;
  }
  int32_t trailing_special() const override {
    for (const auto& s : steps)
      if (s->trailing_special() >= 0) return s->trailing_special();
    return -1;
  }
};

std::unique_ptr<PostProcessor> parse_template(const JsonReader& r, const json& j, const std::string& path) {
  auto out = std::make_unique<TemplateProcessor>();
  const std::string single_path = JsonReader::join(path, "single");
  const json& single = r.array(r.required(j, "single", path), single_path);
  const json& specials = r.object(r.required(j, "special_tokens", path), JsonReader::join(path, "special_tokens"));
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string ip = JsonReader::index(single_path, i);
    const json& item = r.object(single[i], ip);
    if (item.contains("Sequence")) {
      const std::string which = r.string(r.required(item["Sequence"], "id", ip + ".Sequence"), ip + ".Sequence.id");
      if (which != "A") r.fail(ip + ".Sequence.id", "must be 'A' in the single-sequence template, got '" + which + "'");
      out->items.emplace_back(std::nullopt);
    } else if (item.contains("SpecialToken")) {
      const std::string name = r.string(item["SpecialToken"], "id", ip + ".SpecialToken");
      auto it = specials.find(name);
      if (it == specials.end())
        r.fail(ip + ".SpecialToken.id", "'" + name + "' is not listed in " + JsonReader::join(path, "special_tokens"));
      const std::string sp = JsonReader::join(path, "special_tokens") + "." + name;
      const json& ids = r.array(r.required(*it, "ids", sp), sp + ".ids");
      std::vector<int32_t> v;
      for (std::size_t k = 0; k < ids.size(); ++k) v.push_back(r.id(ids[k], JsonReader::index(sp + ".ids", k)));
      out->items.emplace_back(std::move(v));
    } else {
      r.fail(ip, "must hold \"Sequence\" or \"SpecialToken\"");
    }
  }
  return out;
}

// Bert / Roberta processors: [cls] $A [sep].
std::unique_ptr<PostProcessor> parse_cls_sep(const JsonReader& r, const json& j, const std::string& path) {
  auto out = std::make_unique<TemplateProcessor>();
  auto token = [&](const char* key) {
    const std::string kp = JsonReader::join(path, key);
    const json& pair = r.array(r.required(j, key, path), kp);
    if (pair.size() != 2) r.fail(kp, "must be [token, id]");
    return std::vector<int32_t>{r.id(pair[1], kp + "[1]")};
  };
  out->items.emplace_back(token("cls"));
  out->items.emplace_back(std::nullopt);
  out->items.emplace_back(token("sep"));
  return out;
}

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const JsonReader& r, const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(r.object(j, path), path);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKD);
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prefix = r.string(j, "prepend", path);
    return n;
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    n->pattern = parse_pattern(r, r.required(j, "pattern", path), JsonReader::join(path, "pattern"));
    n->content = r.string(j, "content", path);
    return n;
  }
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = r.boolean(j, "strip_left", path, false);
    n->right = r.boolean(j, "strip_right", path, false);
    return n;
  }
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    const std::string lp = JsonReader::join(path, "normalizers");
    const json& list = r.array(r.required(j, "normalizers", path), lp);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = parse_normalizer(r, list[i], JsonReader::index(lp, i));
      if (step) n->steps.push_back(std::move(step));
    }
    return n;
  }
  r.unsupported(path, type);
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonReader& r, const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(r.object(j, path), path);
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = r.boolean(j, "add_prefix_space", path, true);
    if (r.boolean(j, "use_regex", path, true)) p->regex = std::make_unique<Regex>(kGpt2Pattern);
    return p;
  }
  if (type == "Split") {
    auto p = std::make_unique<SplitPreTokenizer>();
    p->pattern = parse_pattern(r, r.required(j, "pattern", path), JsonReader::join(path, "pattern"));
    p->behavior = parse_behavior(r, j, path);
    p->invert = r.boolean(j, "invert", path, false);
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = parse_char(r, j, "replacement", path);
    p->replacement_utf8.clear();
    append_utf8(p->replacement_utf8, p->replacement);
    p->scheme = parse_prepend_scheme(r, j, path);
    p->split = r.boolean(j, "split", path, true);
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = r.boolean(j, "individual_digits", path, false);
    return p;
  }
  if (type == "Sequence") {
    auto p = std::make_unique<SequencePreTokenizer>();
    const std::string lp = JsonReader::join(path, "pretokenizers");
    const json& list = r.array(r.required(j, "pretokenizers", path), lp);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = parse_pre_tokenizer(r, list[i], JsonReader::index(lp, i));
      if (step) p->steps.push_back(std::move(step));
    }
    return p;
  }
  r.unsupported(path, type);
}

std::unique_ptr<Decoder> parse_decoder(const JsonReader& r, const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(r.object(j, path), path);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = parse_char(r, j, "replacement", path);
    d->scheme = parse_prepend_scheme(r, j, path);
    return d;
  }
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDecoder>();
    d->pattern = parse_pattern(r, r.required(j, "pattern", path), JsonReader::join(path, "pattern"));
    d->content = r.string(j, "content", path);
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    d->content = parse_char(r, j, "content", path);
    const int64_t start = r.integer(j, "start", path, 0), stop = r.integer(j, "stop", path, 0);
    if (start < 0) r.fail(JsonReader::join(path, "start"), "must not be negative");
    if (stop < 0) r.fail(JsonReader::join(path, "stop"), "must not be negative");
    d->start = static_cast<std::size_t>(start);
    d->stop = static_cast<std::size_t>(stop);
    return d;
  }
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDecoder>();
    const std::string lp = JsonReader::join(path, "decoders");
    const json& list = r.array(r.required(j, "decoders", path), lp);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = parse_decoder(r, list[i], JsonReader::index(lp, i));
      if (step) d->steps.push_back(std::move(step));
    }
    return d;
  }
  r.unsupported(path, type);
}

std::unique_ptr<PostProcessor> parse_post_processor(const JsonReader& r, const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(r.object(j, path), path);
  if (type == "TemplateProcessing") return parse_template(r, j, path);
  if (type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (type == "BertProcessing" || type == "RobertaProcessing") return parse_cls_sep(r, j, path);
  if (type == "Sequence") {
    auto p = std::make_unique<SequenceProcessor>();
    const std::string lp = JsonReader::join(path, "processors");
    const json& list = r.array(r.required(j, "processors", path), lp);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = parse_post_processor(r, list[i], JsonReader::index(lp, i));
      if (step) p->steps.push_back(std::move(step));
    }
    return p;
  }
  r.unsupported(path, type);
}

}  // namespace ax::tok
