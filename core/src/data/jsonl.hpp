// Data files as users have them, read in one place for every built-in dataset type: JSON Lines, a JSON array
// of objects, Parquet (HF datasets' on-disk format; when built with it), one file or many by glob. Every row
// becomes one JSON object (a Parquet row: column name -> value), so a type checks and reads rows the same way
// whatever the file format. Rows are checked in parallel; a bad one is an error naming file and row
// ("a.jsonl:7", "a.json: element 6", "a.parquet: row 6"), or (on_bad_row = "skip") dropped and counted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::data {

enum class BadRowPolicy { error, skip };
BadRowPolicy parse_bad_row_policy(const std::string& text);  // "error" | "skip"

enum class FileFormat { jsonl, json_array, parquet };
const char* format_name(FileFormat f);  // "jsonl", "json", "parquet"

// One file a dataset entry's `path` named (or its glob matched).
struct DataFile {
  std::string path;
  FileFormat format = FileFormat::jsonl;
};

// Where a row came from: `index` is the 1-based line of a JSONL file, the 0-based element of a JSON array,
// the 0-based row of a Parquet file.
struct RowOrigin {
  std::uint32_t file = 0;  // into the DataFile list
  std::uint64_t index = 0;
};

// "a.jsonl:7", "a.json: element 6", "a.parquet: row 6".
std::string describe_origin(const std::vector<DataFile>& files, RowOrigin origin);

// The origins of a dataset's samples, for errors found after tokenising (a token id the model lacks, no
// token to train on).
struct RowSources {
  std::vector<DataFile> files;
  std::vector<RowOrigin> origins;  // one per sample
  std::string where(std::size_t sample) const { return describe_origin(files, origins.at(sample)); }
};

// Implemented (besides ax::Dataset) by the built-in dataset types. An internal side interface, so that
// ax::Dataset (plugin ABI) stays as it is; other types' samples are named by index.
class RowLines {
 public:
  virtual ~RowLines() = default;
  virtual const RowSources& row_sources() const = 0;
};

struct JsonlRow {
  RowOrigin origin;
  nlohmann::json value;  // an object
};

struct JsonlContents {
  std::vector<DataFile> files;  // sorted by path
  std::vector<JsonlRow> rows;   // files in order, each in file order
  std::size_t skipped = 0;
};

// True when `path` holds a glob metacharacter (*, ?, [).
bool is_glob(const std::string& path);

// The files `path` names: itself, or (a glob) every regular file matching it, sorted bytewise so the order —
// and with it the samples, the eval split, the cache — is the same on every machine. Throws UsageError when
// a glob matches nothing.
std::vector<std::string> expand_data_path(const std::string& path);

// JSONL, a JSON array, or Parquet: ".parquet" (or the PAR1 magic) is Parquet; otherwise a file whose first
// non-blank byte is '[' is a JSON array, anything else JSON Lines (HF datasets' to_json writes JSON Lines
// into ".json" files, so the extension alone cannot tell).
FileFormat detect_format(const std::string& path);

// Reads every file `path` names. `check` returns "" for a usable row, else what is wrong with it ("'text' is
// missing"). Throws UsageError naming file and row for the first bad row (files in order, rows in file
// order) under BadRowPolicy::error, or when a file cannot be read or parsed as a whole.
JsonlContents read_rows(const std::string& path, BadRowPolicy policy,
                        const std::function<std::string(const nlohmann::json&)>& check);

// The name the JSONL-only reader had; types written against it read every format.
inline JsonlContents read_jsonl(const std::string& path, BadRowPolicy policy,
                                const std::function<std::string(const nlohmann::json&)>& check) {
  return read_rows(path, policy, check);
}

// The rows of one Parquet file as JSON objects (data/parquet.cpp), without the columns of an Arrow type no
// dataset type reads (`unread`: "'blob' (binary)"); without Parquet support, a UsageError "built without
// Parquet support". Exposed for the tests.
struct ParquetRows {
  std::vector<nlohmann::json> rows;
  std::vector<std::string> unread;
};
ParquetRows read_parquet_rows(const std::string& path);
bool parquet_supported();

}  // namespace ax::data
