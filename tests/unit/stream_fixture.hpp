// The streamed run the stream tests share (stream_test.cpp, stream_prefetch_test.cpp): a directory with three
// JSON Lines shards of one-digit sums and a run.toml that streams them.
#pragma once
#include <filesystem>
#include <string>

#include "unit/train_harness.hpp"

namespace ax::test {

// Sums "a+b=" -> "c" over three shards of 10 rows (rows of 24 tokens: a few samples per packed row).
inline std::filesystem::path make_stream_dir(const std::string& name, const std::string& dataset_extra, const std::string& extra) {
  auto dir = scratch_dir(name);
  for (int shard = 0; shard < 3; ++shard) {
    std::string rows;
    for (int i = 0; i < 10; ++i) {
      const int n = shard * 10 + i, a = (n * 7) % 10, b = (n * 3 + 1) % 10;
      rows += "{\"prompt\": \"" + std::to_string(a) + "+" + std::to_string(b) + "=\", \"text\": \"" + std::to_string(a + b) + "\"}\n";
    }
    write_text(dir / ("sums-" + std::to_string(shard) + ".jsonl"), rows);
  }
  write_text(dir / "run.toml", "[run]\noutput_dir = \"out\"\nseed = 3\n"
                               "[data]\nsequence_len = 24\ncache = false\n"
                               "[[datasets]]\ntype = \"completion\"\npath = \"sums-*.jsonl\"\nprompt_field = \"prompt\"\n" +
                                   dataset_extra +
                                   "[train]\nlr = 0.01\nschedule = \"constant\"\nmax_steps = 8\n"
                                   "[checkpoint]\nevery_steps = 4\nkeep_last = 10\n" + extra);
  return dir;
}

}  // namespace ax::test
