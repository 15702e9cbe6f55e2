#include "data/entry.hpp"

#include <filesystem>

#include "axengine/strings.hpp"

namespace ax::data {

const std::vector<std::string>& common_dataset_keys() {
  static const std::vector<std::string> keys{"type", "name", "path", "eval_path", "eval_fraction", "on_bad_row", "streaming"};
  return keys;
}

void bind_common_entry(TableBinder& t, CommonEntry& e) {
  t.field("type", e.type, "dataset type: completion, pretokenized, alpaca, chat_template, or one a plugin registers");
  t.field("name", e.name, "name shown in logs (default: the file name)");
  t.field("path", e.path, "data file(s) of training rows, relative to the config file: JSONL, a JSON array or Parquet; a glob (data/*.parquet) reads every match, sorted");
  t.field("eval_path", e.eval_path, "data file(s) of evaluation rows (same formats, glob too); when absent, eval_fraction of `path` is held out");
  t.field("eval_fraction", e.eval_fraction, "fraction of this dataset held out for evaluation (default: [data].eval_fraction)");
  t.choice("on_bad_row", e.on_bad_row, {"error", "skip"}, "a malformed row stops naming its file and row (error), or is dropped and counted (skip)");
  t.field("streaming", e.streaming, "read the rows lazily from the JSON Lines shards `path` names (a glob, sorted), packing as they come, instead of preparing them all first; needs train.max_steps (types: completion, pretokenized, mm_cpt; docs/datasets.md, \"Streaming\")");
}

std::string resolve_against(const std::string& base_dir, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || fs::path(path).is_absolute() || base_dir.empty()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

CommonEntry read_common_entry(TableBinder& t, const DatasetContext& ctx) {
  CommonEntry e;
  bind_common_entry(t, e);
  if (e.path.empty()) t.fail(nullptr, "this [[datasets]] entry has no 'path'");
  if (e.eval_fraction > 1.0) t.fail(t.table()->get("eval_fraction"), "'eval_fraction' must be in [0, 1)");
  e.path = resolve_against(ctx.base_dir, e.path);
  e.eval_path = resolve_against(ctx.base_dir, e.eval_path);
  if (e.name.empty()) e.name = std::filesystem::path(e.path).filename().string();
  return e;
}

}  // namespace ax::data
