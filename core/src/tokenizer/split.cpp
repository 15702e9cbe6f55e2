#include "tokenizer/split.hpp"

#include <stdexcept>

namespace ax::tok {

// HF's {"String": s} / {"Regex": r} pattern, compiled (a string is matched literally).
std::unique_ptr<Regex> parse_pattern(const JsonReader& r, const json& j, const std::string& path) {
  r.object(j, path);
  try {
    const std::string origin = r.file + ": " + path;
    if (j.contains("String")) return std::make_unique<Regex>(Regex::escape(r.string(j, "String", path)), origin);
    if (j.contains("Regex")) return std::make_unique<Regex>(r.string(j, "Regex", path), origin);
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

std::vector<Segment> segments_by_char(std::string_view s, const std::function<bool(char32_t)>& pred) {
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t b = i;
    if (pred(next_code_point(s, i))) matches.emplace_back(b, i);
  }
  return segments_from_matches(matches, s.size());
}

Behavior parse_behavior(const JsonReader& r, const json& j, const std::string& path) {
  const std::string b = r.string(j, "behavior", path);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  r.fail(JsonReader::join(path, "behavior"), "'" + b + "' is not a split behavior");
}

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

std::string replace_all(const std::string& text, const Regex& pattern, const std::string& content, std::size_t max_size) {
  const auto matches = pattern.find_all(text);
  if (matches.empty()) return text;
  // The result's size is known before anything is built: refuse it rather than run out of memory.
  std::size_t removed = 0;
  for (auto [b, e] : matches) removed += e - b;
  const std::size_t size = text.size() - removed, inserted = matches.size();
  if (!content.empty() && inserted > (max_size - std::min(size, max_size)) / content.size())
    throw std::length_error("Replace would make the text longer than " + std::to_string(max_size) + " bytes (" +
                            std::to_string(inserted) + " matches of a " + std::to_string(content.size()) + "-byte replacement)");
  if (size > max_size) throw std::length_error("Replace would make the text longer than " + std::to_string(max_size) + " bytes");
  std::string out;
  out.reserve(size + inserted * content.size());
  std::size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(text, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  return out;
}

PrependScheme parse_prepend_scheme(const JsonReader& r, const json& j, const std::string& path) {
  auto scheme = r.optional_string(j, "prepend_scheme", path);
  if (!scheme) return r.boolean(j, "add_prefix_space", path, true) ? PrependScheme::Always : PrependScheme::Never;
  if (*scheme == "always") return PrependScheme::Always;
  if (*scheme == "never") return PrependScheme::Never;
  if (*scheme == "first") return PrependScheme::First;
  r.fail(JsonReader::join(path, "prepend_scheme"), "'" + *scheme + "' is not one of always, never, first");
}

}  // namespace ax::tok
