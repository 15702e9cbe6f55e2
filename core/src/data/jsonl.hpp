// Data files as users have them, read in one place for every built-in dataset type: JSON Lines, a JSON array
// of objects, Parquet (HF datasets' Hub format) and Arrow IPC (when built with Arrow), one file or many by glob,
// or a directory HF datasets wrote (save_to_disk, its cache: data/dataset_source.hpp), with a `split` slice
// (data/split_spec.hpp). Every row becomes one JSON object (a Parquet or Arrow row: column name -> value), so a
// type checks and reads rows the same way whatever the file format. Rows are checked in parallel; a bad one is
// an error naming file and row ("a.jsonl:7", "a.json: element 6", "a.parquet: row 6"), or (on_bad_row = "skip")
// dropped and counted.
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

// Stored by number in the prepared-data cache (data/prepare.cpp): append only.
enum class FileFormat { jsonl, json_array, parquet, arrow };
constexpr FileFormat kLastFileFormat = FileFormat::arrow;
const char* format_name(FileFormat f);  // "jsonl", "json", "parquet", "arrow"

// One file a dataset entry's `path` named (or its glob matched).
struct DataFile {
  std::string path;
  FileFormat format = FileFormat::jsonl;
};

// Where a row came from: `index` is the 1-based line of a JSONL file, the 0-based element of a JSON array,
// the 0-based row of a Parquet or Arrow file.
struct RowOrigin {
  std::uint32_t file = 0;  // into the DataFile list
  std::uint64_t index = 0;
};

// "a.jsonl:7", "a.json: element 6", "a.parquet: row 6", "data-00000-of-00001.arrow: row 6".
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

// JSONL, a JSON array, Parquet or Arrow IPC: ".parquet" (or the PAR1 magic) is Parquet, ".arrow" (or the ARROW1
// magic, or the stream format's first bytes) Arrow; otherwise a file whose first non-blank byte is '[' is a JSON
// array, anything else JSON Lines (HF datasets' to_json writes JSON Lines into ".json" files, so the extension
// alone cannot tell).
FileFormat detect_format(const std::string& path);

// Reads the rows of `split` (data/split_spec.hpp: "train[:20%]"; "" = every row of a source with one split, the
// "train" split of one with several) of the source `path` names (data/dataset_source.hpp). `check` returns ""
// for a usable row, else what is wrong with it ("'text' is missing"). Throws UsageError naming file and row for
// the first bad row (files in order, rows in file order) under BadRowPolicy::error, when a file cannot be read or
// parsed as a whole, or for a split the source lacks or a slice that selects no row (naming the split's rows).
JsonlContents read_rows(const std::string& path, const std::string& split, BadRowPolicy policy,
                        const std::function<std::string(const nlohmann::json&)>& check);

// Every row of `path` (no split).
inline JsonlContents read_rows(const std::string& path, BadRowPolicy policy,
                               const std::function<std::string(const nlohmann::json&)>& check) {
  return read_rows(path, "", policy, check);
}
inline JsonlContents read_jsonl(const std::string& path, BadRowPolicy policy,  // the name the JSONL-only reader had
                                const std::function<std::string(const nlohmann::json&)>& check) {
  return read_rows(path, "", policy, check);
}

// The rows of one Parquet file as JSON objects (data/arrow_rows.hpp), without the columns of an Arrow type no
// dataset type reads (`unread`: "'blob' (binary)"); without Parquet support, a UsageError "built without
// Parquet support". Exposed for the tests.
struct ParquetRows {
  std::vector<nlohmann::json> rows;
  std::vector<std::string> unread;
};
ParquetRows read_parquet_rows(const std::string& path);
bool parquet_supported();  // Parquet and Arrow IPC both: the same libraries
// A path that is read through Arrow: *.parquet, *.arrow, or a directory (datasets' layouts).
bool needs_arrow(const std::string& path);

}  // namespace ax::data
