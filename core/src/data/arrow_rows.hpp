// Columnar data files as rows: Parquet (HF datasets' Hub format) and Arrow IPC (what datasets' save_to_disk and
// its cache write), read with the libarrow/libparquet of the pyarrow wheel when the build found them
// (AXENGINE_WITH_PARQUET, cmake/AxParquet.cmake). The file's record batches are read first (an Arrow IPC file is
// memory-mapped, not copied), so a `split` slice converts only the rows it selects. Each row becomes a JSON
// object, column name -> value (data/arrow_rows.cpp says how each Arrow type maps); a column of a type no dataset
// type reads is left out and listed in unread(). No Arrow header here: data/jsonl.cpp includes this.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ax::data {

class ArrowTable {
 public:
  // Throws UsageError naming the file: unreadable, not of its format, or (without Arrow support in the build)
  // "built without Parquet/Arrow support".
  static ArrowTable read_parquet(const std::string& path);
  static ArrowTable read_ipc(const std::string& path);  // the stream format (datasets) or the file format

  ArrowTable(ArrowTable&&) noexcept;
  ArrowTable& operator=(ArrowTable&&) noexcept;
  ~ArrowTable();

  const std::string& path() const;
  int64_t num_rows() const;
  // Rows [from, to) (within num_rows()), each an object of the readable columns, restricted to `columns` when
  // not empty (save_to_disk's _format_columns). Throws UsageError naming the file and row for a value that
  // cannot be converted.
  std::vector<nlohmann::json> rows(int64_t from, int64_t to, const std::vector<std::string>& columns = {}) const;
  // The columns left out: "'blob' (binary)".
  const std::vector<std::string>& unread() const;

  struct Impl;  // the record batches and their index (data/arrow_rows.cpp)

 private:
  explicit ArrowTable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Whether this build reads Parquet and Arrow IPC files.
bool arrow_supported();

}  // namespace ax::data
