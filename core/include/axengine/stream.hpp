// Streaming (iterable) datasets: samples read lazily, row by row, from sorted shards, with a cursor that a
// checkpoint stores so a resumed run continues at the next row without reading, tokenising or decoding the
// rows before it (docs/datasets.md, "Streaming"). A dataset type that can stream implements
// StreamingDatasetType besides DatasetType; the engine finds it with dynamic_cast, so DatasetType (the
// plugin ABI) is unchanged and types that cannot stream need nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/dataset.hpp"

namespace ax {

// Where a stream stands: the next row to read starts at byte `offset` of shard `shard` (an index into the
// sorted shard list), which is that shard's line `line` (1-based); `pass` counts completed passes over all
// shards. `file` names the shard, so a resume over changed shards is refused instead of misread.
struct StreamCursor {
  uint64_t pass = 0, shard = 0, offset = 0, line = 1;
  std::string file;
  nlohmann::json to_json() const;
  // Throws UsageError naming `what` for a malformed cursor.
  static StreamCursor from_json(const nlohmann::json& j, const std::string& what);
};

class SampleStream {
 public:
  virtual ~SampleStream();
  // The next usable sample of the current pass; false at the end of the last shard. A bad row throws a
  // UsageError naming its shard and line ("a.jsonl:7: ..."), or under on_bad_row = "skip" is counted and
  // passed over.
  virtual bool next(Sample& out) = 0;
  // Where the next row starts (pass included).
  virtual StreamCursor cursor() const = 0;
  // Continues at `c` (a cursor() of a stream over the same shards); UsageError when the shards changed.
  virtual void seek(const StreamCursor& c) = 0;
  // "a.jsonl:7": the row of the last sample next() returned.
  virtual std::string last_origin() const = 0;
  virtual std::size_t skipped_rows() const = 0;
  // The shards, sorted.
  virtual const std::vector<std::string>& shards() const = 0;
};

class StreamingDatasetType {
 public:
  virtual ~StreamingDatasetType();
  // The entry's rows as a stream (the entry as DatasetType::open gets it, `streaming = true` included).
  virtual std::unique_ptr<SampleStream> open_stream(const toml::table& entry, const DatasetContext& ctx) const = 0;
};

// The files a glob names (or the one file a plain path names), sorted bytewise. UsageError naming the pattern
// when none matches or a plain path does not exist.
std::vector<std::string> stream_shards(const std::string& path);

// The stream every JSON Lines type builds on: reads `shards` line by line (blank lines skipped), parses each
// line as a JSON object and hands it to `convert`, which returns the sample or throws (a bad row: UsageError /
// std::exception with what is wrong). `skip_bad_rows` is on_bad_row = "skip". A shard that cannot be opened,
// or whose first non-blank byte is '[' (a JSON array, which has no rows to seek to), is an error naming it.
std::unique_ptr<SampleStream> make_jsonl_stream(std::vector<std::string> shards, bool skip_bad_rows,
                                                std::function<Sample(const nlohmann::json& row, const std::string& shard)> convert);

}  // namespace ax
