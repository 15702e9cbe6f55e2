// Pre-tokenizers: split pieces into the words the BPE model sees.
#include <optional>

#include "tokenizer/split.hpp"

namespace ax::tok {
namespace {

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

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const JsonReader& r, const json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(r.object(j, path), path);
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = r.boolean(j, "add_prefix_space", path, true);
    if (r.boolean(j, "use_regex", path, true)) p->regex = std::make_unique<Regex>(kGpt2Pattern, r.file + ": " + path + " (ByteLevel's GPT-2 pattern)");
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

}  // namespace ax::tok
