// Directories HF datasets writes (data/dataset_source.hpp) read through a `split` (data/split_spec.hpp) by a built-in
// type: the layout files (state.json, dataset_info.json, dataset_dict.json) with their format checks, the Arrow IPC
// files through libarrow's stream/file readers and our Arrow -> JSON conversion (data/arrow_rows.cpp), the split
// string and its slice over the shards. The seeds are real datasets-written directories (tests/data/datasets/arrow).
//
// Input parts (kSeparator): [0] "<layout><type><split>": layout 's' (a saved Dataset: [1] state.json,
// [2] dataset_info.json, [3..] data-0000i-of-0000N.arrow), 'd' (a DatasetDict: [1] dataset_dict.json, then a
// "train" split dir as for 's'), 'c' (a datasets cache dir: [1] dataset_info.json, [2..] json-train.arrow or its
// shards json-train-0000i-of-0000N.arrow); type 'c' completion (prompt/text), 'a' alpaca, 'p' pretokenized; the
// rest of the line is the split ("" = none).
#include <cstdio>
#include <filesystem>

#include "dataset_rows.hpp"

namespace {

std::string shard_name(const char* prefix, std::size_t i, std::size_t n) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s-%05zu-of-%05zu.arrow", prefix, i, n);
  return buf;
}

}  // namespace

AX_FUZZ_HARNESS(dataset_arrow) {
  static tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  static const auto completion = ax::data::make_completion_type();
  static const auto alpaca = ax::data::make_alpaca_type();
  static const auto pretokenized = ax::data::make_pretokenized_type();
  ax::fuzz::quiet_logs();
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 8);
  if (parts.size() < 3 || parts[0].size() < 2) return;
  const char layout = parts[0][0], kind = parts[0][1];
  const std::string split(parts[0].substr(2));
  const std::string root = ax::fuzz::fresh_dir("ds");
  std::size_t next = 1;
  std::string dir = root;
  if (layout == 'd') {
    ax::fuzz::write_file(root + "/dataset_dict.json", parts[next++]);
    dir = root + "/train";
    std::filesystem::create_directories(dir);
  }
  if (layout == 's' || layout == 'd') {
    if (parts.size() < next + 2) return;
    ax::fuzz::write_file(dir + "/state.json", parts[next++]);
    ax::fuzz::write_file(dir + "/dataset_info.json", parts[next++]);
    const std::size_t n = parts.size() - next;
    for (std::size_t i = 0; next < parts.size(); ++i) ax::fuzz::write_file(dir + "/" + shard_name("data", i, n), parts[next++]);
  } else if (layout == 'c') {
    ax::fuzz::write_file(dir + "/dataset_info.json", parts[next++]);
    const std::size_t n = parts.size() - next;
    for (std::size_t i = 0; next < parts.size(); ++i)
      ax::fuzz::write_file(dir + "/" + (n == 1 ? std::string("json-train.arrow") : shard_name("json-train", i, n)), parts[next++]);
  } else {
    return;
  }
  toml::table entry{{"path", root}};
  if (!split.empty()) entry.insert("split", split);
  const ax::DatasetType* type = alpaca.get();
  if (kind == 'c') {
    type = completion.get();
    entry.insert("prompt_field", "prompt");
  } else if (kind == 'p') {
    type = pretokenized.get();
  }
  const ax::Tokenizer& tok = ax::fuzz::dataset_tokenizer();
  ax::DatasetContext ctx{&tok, "fuzz.toml", ax::fuzz::scratch()};
  auto ds = type->open(entry, ctx);
  const int64_t vocab = tok.vocab_size();
  for (std::size_t i = 0; i < ds->size(); ++i) {
    ax::Sample s = ds->get(i);
    if (s.input_ids.size() != s.labels.size()) std::abort();
    for (std::size_t k = 0; k < s.input_ids.size(); ++k)
      if (s.input_ids[k] < 0 || s.input_ids[k] >= vocab || (s.labels[k] != -100 && (s.labels[k] < 0 || s.labels[k] >= vocab)))
        std::abort();
  }
}
