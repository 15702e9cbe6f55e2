// Small string helpers shared by core and plugins.
#pragma once
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace ax {

// Concatenates anything streamable: ax::str("expected ", n, " tensors") .
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Joins with a separator: join({"a","b"}, ", ") == "a, b".
std::string join(const std::vector<std::string>& items, std::string_view sep);

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, or "" when none is close enough to be a plausible typo.
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace ax
