// Helpers shared by the pipeline stages: HF's {"String"|"Regex"} patterns, NormalizedString::split with its
// five behaviors, Metaspace's prepend scheme, and piece bookkeeping.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/components.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace ax::tok {

std::unique_ptr<Regex> parse_pattern(const JsonReader& r, const json& j, const std::string& path);
char32_t parse_char(const JsonReader& r, const json& j, const std::string& key, const std::string& path);

// A segment of a string and whether the splitting pattern matched it (HF's find_matches output: the segments
// cover the whole string in order).
struct Segment {
  std::size_t begin, end;
  bool is_match;
};
std::vector<Segment> segments_from_matches(const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                                           std::size_t size);
// Every single character satisfying `pred` is its own match (HF's Pattern for Fn(char) -> bool).
std::vector<Segment> segments_by_char(std::string_view s, const std::function<bool(char32_t)>& pred);

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
Behavior parse_behavior(const JsonReader& r, const json& j, const std::string& path);
// HF NormalizedString::split: which [begin, end) ranges survive for a given behavior.
std::vector<std::pair<std::size_t, std::size_t>> apply_behavior(const std::vector<Segment>& segs, Behavior behavior);

// Replaces every piece that is not yet a token by the non-empty pieces `split` makes of it.
void split_pieces(std::vector<Piece>& pieces, const std::function<void(Piece&, std::vector<Piece>&)>& split);
// Appends the non-empty sub-pieces [b, e) of `p`.
void emit_ranges(const Piece& p, const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                 std::vector<Piece>& out);
// Throws std::length_error instead of building a result longer than `max_size`.
std::string replace_all(const std::string& text, const Regex& pattern, const std::string& content,
                        std::size_t max_size = std::string::npos);

enum class PrependScheme { Always, Never, First };
PrependScheme parse_prepend_scheme(const JsonReader& r, const json& j, const std::string& path);

}  // namespace ax::tok
