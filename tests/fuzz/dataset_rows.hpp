// Shared by the JSONL dataset harnesses: open one [[datasets]] entry of a built-in type over the fuzzed file,
// with the tokenizer of a real model (tests/data/tokenizers/qwen2_bytelevel), and fetch every sample as the
// engine's preparation does.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include <tbb/global_control.h>
#include <toml++/toml.h>

#include "axengine/dataset.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "data/types.hpp"
#include "harness.hpp"

namespace ax::fuzz {

// The chat_template entry options a fuzzed flags byte picks, shared by the chat harnesses: on_bad_row = "skip"
// (bit 0), ShareGPT's field names and roles (bit 1), train_on (bits 2-3).
inline void add_chat_options(toml::table& entry, unsigned flags) {
  if (flags & 1) entry.insert("on_bad_row", "skip");
  if (flags & 2) {
    entry.insert("field_messages", "conversations");
    entry.insert("message_field_role", "from");
    entry.insert("message_field_content", "value");
    entry.insert("roles", toml::table{{"human", "user"}, {"gpt", "assistant"}});
  }
  static const char* const train_on[] = {"assistant", "all", "last", "assistant"};
  entry.insert("train_on", train_on[(flags >> 2) & 3]);
}

inline const ax::Tokenizer& dataset_tokenizer() {
  static const std::unique_ptr<ax::Tokenizer> tok = [] {
    const std::string dir = std::string(AXENGINE_TEST_DATA_DIR) + "/tokenizers/qwen2_bytelevel";
    try {
      return ax::load_hf_tokenizer(dir);
    } catch (const std::exception& e) {
      setup_failed(dir.c_str(), e);
    }
  }();
  return *tok;
}

// The first input byte picks the entry's options (bit 0: on_bad_row = "skip"; bit 1: a prompt field, for
// `completion`), the rest is the JSONL file.
inline void open_dataset_rows(const ax::DatasetType& type, const std::uint8_t* data, std::size_t size,
                              bool completion) {
  // One thread: rows are parsed with tbb::parallel_for, and on a small machine two fuzzers at a time already
  // fill the cores.
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  if (size == 0) return;
  const std::uint8_t flags = data[0];
  const std::string path = scratch() + "/rows.jsonl";
  write_file(path, {reinterpret_cast<const char*>(data + 1), size - 1});
  toml::table entry{{"type", completion ? "completion" : "pretokenized"}, {"path", path}};
  if (flags & 1) entry.insert("on_bad_row", "skip");
  if (completion && (flags & 2)) entry.insert("prompt_field", "prompt");
  if (completion && (flags & 4)) entry.insert("add_bos", false);
  ax::DatasetContext ctx{&dataset_tokenizer(), "fuzz.toml", scratch()};
  auto ds = type.open(entry, ctx);
  const int64_t vocab = dataset_tokenizer().vocab_size();
  for (std::size_t i = 0; i < ds->size(); ++i) {
    ax::Sample s = ds->get(i);
    // What the engine relies on downstream (packing, the embedding lookup): equal lengths, ids in range.
    if (s.input_ids.size() != s.labels.size()) std::abort();
    for (std::size_t k = 0; k < s.input_ids.size(); ++k) {
      if (s.input_ids[k] < 0 || s.input_ids[k] >= vocab) std::abort();
      if (s.labels[k] != -100 && (s.labels[k] < 0 || s.labels[k] >= vocab)) std::abort();
    }
  }
}

}  // namespace ax::fuzz
