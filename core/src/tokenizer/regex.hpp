// PCRE2 in UTF + Unicode-property mode (JIT-compiled where available): the regex engine behind Split, the
// ByteLevel pre-tokenizer and Replace. HF uses Oniguruma; for the patterns tokenizers ship (\p{L}, \p{N}, \s,
// lookahead, (?i:...)) the two agree.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ax::tok {

class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message and offset when the pattern does not compile.
  // `origin` says where the pattern comes from ("tokenizer.json: pre_tokenizer.pattern") for match errors.
  explicit Regex(const std::string& pattern, std::string origin = "");
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches, left to right, as [begin, end) byte ranges; `text` must be valid UTF-8.
  // An empty match moves the search on by one character (as Oniguruma's find_iter does). A match that runs
  // into PCRE2's limits (JIT stack, backtracking) throws UsageError naming the origin and the pattern.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

  // The pattern that matches `literal` exactly.
  static std::string escape(std::string_view literal);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ax::tok
