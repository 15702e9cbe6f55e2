// The plugin's reader of data rows: JSON Lines (one object per non-blank line) or a JSON array of objects,
// one file or a glob (sorted bytewise, as core's reader). The plugin links only axengine::core, and core's
// reader (data/jsonl.hpp, Parquet too) is a built-in, so the JSON forms are read here; Parquet is not.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::mm {

struct Row {
  std::uint32_t file = 0;
  std::uint64_t index = 0;  // 1-based line (JSONL) or 0-based element (JSON array)
  nlohmann::json value;     // an object
};

struct RowFile {
  std::string path;
  bool array = false;
};

struct Rows {
  std::vector<RowFile> files;
  std::vector<Row> rows;
  // "a.jsonl:7" / "a.json: element 6".
  std::string where(const Row& r) const;
};

// The files `path` names (a glob: every regular file matching, sorted; none is an error).
std::vector<std::string> expand_paths(const std::string& path);
// Parses the rows of the files `path` names; a line that is not a JSON object is an error naming file:line.
Rows read_rows(const std::string& path);
// One file's bytes as rows (`name` for errors); the fuzz target's entry point.
void parse_rows(const std::string& text, std::uint32_t file_index, const std::string& name, Rows& out);

}  // namespace ax::mm
