// Normalizers: text -> text, applied to each piece between raw added tokens.
#include <optional>
#include <stdexcept>

#include "tokenizer/split.hpp"

namespace ax::tok {
namespace {

void check_size(std::size_t size, std::size_t max_size, const char* step) {
  if (size > max_size)
    throw std::length_error(std::string("normalizer step ") + step + " would make the text longer than " +
                            std::to_string(max_size) + " bytes");
}

struct UnicodeNormalizer : Normalizer {
  NormalForm form;
  explicit UnicodeNormalizer(NormalForm f) : form(f) {}
  void apply(std::string& text, std::size_t max_size) const override {
    text = tok::normalize(text, form);
    check_size(text.size(), max_size, "NFC/NFD/NFKC/NFKD");
  }
};

struct PrependNormalizer : Normalizer {
  std::string prefix;
  void apply(std::string& text, std::size_t max_size) const override {
    if (text.empty()) return;
    check_size(text.size() + prefix.size(), max_size, "Prepend");
    text.insert(0, prefix);
  }
};

struct ReplaceNormalizer : Normalizer {
  std::unique_ptr<Regex> pattern;
  std::string content;
  void apply(std::string& text, std::size_t max_size) const override {
    text = replace_all(text, *pattern, content, max_size);
  }
};

struct StripNormalizer : Normalizer {
  bool left = false, right = false;
  void apply(std::string& text, std::size_t) const override {
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
  void apply(std::string& text, std::size_t max_size) const override {
    for (const auto& s : steps) s->apply(text, max_size);  // one budget for the whole chain, from its input
  }
};

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

}  // namespace ax::tok
