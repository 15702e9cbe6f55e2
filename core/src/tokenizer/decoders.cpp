// Decoders: HF's decode_chain over token strings.
#include <optional>

#include "tokenizer/split.hpp"

namespace ax::tok {
namespace {

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

}  // namespace

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

}  // namespace ax::tok
