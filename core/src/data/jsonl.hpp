// JSON Lines input shared by the built-in dataset types: every non-blank line is one JSON object. Lines are
// parsed and checked in parallel; a bad one is an error naming file:line, or (on_bad_row = "skip") dropped and
// counted.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::data {

enum class BadRowPolicy { error, skip };
BadRowPolicy parse_bad_row_policy(const std::string& text);  // "error" | "skip"

struct JsonlRow {
  std::size_t line = 0;  // 1-based line number in the file
  nlohmann::json value;
};

struct JsonlContents {
  std::vector<JsonlRow> rows;  // in file order
  std::size_t skipped = 0;
};

// Implemented (besides ax::Dataset) by the built-in JSONL dataset types: the 1-based line of sample `index` in
// the entry's `path`, for errors found after tokenising (a token id the model lacks, no token to train on). An
// internal side interface, so that ax::Dataset (plugin ABI) stays as it is; other types' samples are named by
// index.
class RowLines {
 public:
  virtual ~RowLines() = default;
  virtual std::size_t row_line(std::size_t index) const = 0;
};

// `check` returns "" for a usable row, else what is wrong with it ("'text' is missing"). Throws UsageError
// "file:line: message" for the first bad row in file order under BadRowPolicy::error, or when the file
// cannot be read.
JsonlContents read_jsonl(const std::string& path, BadRowPolicy policy,
                         const std::function<std::string(const nlohmann::json&)>& check);

}  // namespace ax::data
