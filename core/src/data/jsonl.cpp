#include "data/jsonl.hpp"

#include <istream>
#include <optional>

#include <tbb/parallel_for.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "input_file.hpp"

namespace ax::data {

BadRowPolicy parse_bad_row_policy(const std::string& text) {
  if (text == "skip") return BadRowPolicy::skip;
  if (text == "error") return BadRowPolicy::error;
  throw UsageError(ax::str("on_bad_row is \"", text, "\", expected \"error\" or \"skip\""));
}

JsonlContents read_jsonl(const std::string& path, BadRowPolicy policy,
                         const std::function<std::string(const nlohmann::json&)>& check) {
  auto stream = open_regular_stream(path, "dataset file");  // a FIFO or device is refused, never read
  std::istream& in = *stream;
  std::vector<std::string> lines;
  std::vector<std::size_t> numbers;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    lines.push_back(std::move(line));
    numbers.push_back(n);
  }
  if (in.bad()) throw UsageError(ax::str(path, ": read error"));

  // Parse in parallel; each slot gets either a value or the reason the row is unusable.
  std::vector<JsonlRow> rows(lines.size());
  std::vector<std::string> problems(lines.size());
  tbb::parallel_for(std::size_t(0), lines.size(), [&](std::size_t i) {
    rows[i].line = numbers[i];
    nlohmann::json v = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) {
      problems[i] = "not valid JSON";
    } else if (!v.is_object()) {
      problems[i] = "expected a JSON object";
    } else {
      problems[i] = check(v);
      if (problems[i].empty()) rows[i].value = std::move(v);
    }
    lines[i].clear();
    lines[i].shrink_to_fit();
  });

  JsonlContents out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (problems[i].empty()) {
      out.rows.push_back(std::move(rows[i]));
      continue;
    }
    std::string where = ax::str(path, ":", numbers[i], ": ", problems[i]);
    if (policy == BadRowPolicy::error)
      throw UsageError(where + " (set on_bad_row = \"skip\" in the [[datasets]] entry to drop such rows)");
    if (out.skipped < 5) log::warn("skipping bad row " + where);
    ++out.skipped;
  }
  if (out.skipped) log::warn(ax::str(path, ": skipped ", out.skipped, " bad row(s) of ", rows.size()));
  return out;
}

}  // namespace ax::data
