// The streaming reader (axengine/stream.hpp, data/stream_rows.cpp) through the `pretokenized` type's
// open_stream: JSON Lines shards read line by line with byte cursors. Input: byte 0 picks the options (bit 0:
// on_bad_row = "skip"), byte 1 where the rest is split into two shards. Besides not crashing, the stream must
// agree with itself: seeking a fresh stream to any cursor it reported gives the same next sample.
#include <cstdlib>
#include <string>
#include <vector>

#include "axengine/error.hpp"
#include "axengine/stream.hpp"
#include "dataset_rows.hpp"

AX_FUZZ_HARNESS(stream_rows) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  static const auto type = ax::data::make_pretokenized_type();
  if (size < 2) return;
  const std::uint8_t flags = data[0];
  const std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
  const std::size_t cut = body.empty() ? 0 : data[1] % (body.size() + 1);
  const std::string dir = ax::fuzz::scratch();
  ax::fuzz::write_file(dir + "/stream-0.jsonl", body.substr(0, cut));
  ax::fuzz::write_file(dir + "/stream-1.jsonl", body.substr(cut));
  toml::table entry{{"type", "pretokenized"}, {"path", dir + "/stream-*.jsonl"}, {"streaming", true}};
  if (flags & 1) entry.insert("on_bad_row", "skip");
  const auto* streaming = dynamic_cast<const ax::StreamingDatasetType*>(type.get());
  if (!streaming) std::abort();
  ax::DatasetContext ctx{&ax::fuzz::dataset_tokenizer(), "fuzz.toml", dir};
  std::vector<ax::StreamCursor> cursors;
  std::vector<std::vector<int32_t>> ids;
  try {
    auto s = streaming->open_stream(entry, ctx);
    ax::Sample smp;
    for (int n = 0; n < 64; ++n) {
      cursors.push_back(s->cursor());
      if (!s->next(smp)) break;
      if (smp.input_ids.empty() || smp.input_ids.size() != smp.labels.size()) std::abort();
      ids.push_back(smp.input_ids);
    }
  } catch (const ax::UsageError&) {
    return;  // a bad row under on_bad_row = "error", a JSON array shard: errors, not crashes
  }
  for (std::size_t i = 0; i < ids.size() && i < 8; ++i) {
    auto s = streaming->open_stream(entry, ctx);
    s->seek(cursors[i]);
    ax::Sample smp;
    if (!s->next(smp) || smp.input_ids != ids[i]) std::abort();
  }
}
