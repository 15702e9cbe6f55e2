#include "data/entry.hpp"

#include <filesystem>

#include "axengine/strings.hpp"

namespace ax::data {

const std::vector<std::string>& common_dataset_keys() {
  static const std::vector<std::string> keys{"type", "name", "path", "eval_path", "eval_fraction", "on_bad_row", "streaming",
                                                "split", "eval_split"};
  return keys;
}

void bind_common_entry(TableBinder& t, CommonEntry& e) {
  t.field("type", e.type, "dataset type: completion, pretokenized, alpaca, chat_template, or one a plugin registers");
  t.field("name", e.name, "name shown in logs (default: the file name)");
  t.field("path", e.path, "training rows, relative to the config file: data file(s) (JSONL, a JSON array, Parquet, Arrow; a glob such as data/*.parquet reads every match, sorted), or a directory HF datasets wrote (save_to_disk's Dataset or DatasetDict, a datasets cache dir; docs/datasets.md)");
  t.field("eval_path", e.eval_path, "evaluation rows (the same forms as path); when absent, eval_split of `path`, else eval_fraction of it, is held out");
  t.field("split", e.split, "the rows of `path` to train on, in HF datasets' split syntax: \"train\", \"train[:20%]\", \"train[100:200]\", \"train[:10]+test[:10]\" (a DatasetDict or datasets cache dir: its split names; files: \"train\"); default: every row (the \"train\" split of a source with several)");
  t.field("eval_split", e.eval_split, "the evaluation rows: this split (same syntax) of eval_path when given, else of path, e.g. \"test\" or \"train[-5%:]\"; instead of eval_fraction");
  t.field("eval_fraction", e.eval_fraction, "fraction of this dataset held out for evaluation (default: [data].eval_fraction)");
  t.choice("on_bad_row", e.on_bad_row, {"error", "skip"}, "a malformed row stops naming its file and row (error), or is dropped and counted (skip)");
  t.field("streaming", e.streaming, "read the rows lazily from the JSON Lines shards `path` names (a glob, sorted), packing as they come, instead of preparing them all first; needs train.max_steps (types: completion, pretokenized, chat_template, mm_cpt; docs/datasets.md, \"Streaming\")");
  if (!t.table()) return;  // documenting the keys
  const toml::table& tab = *t.table();
  if (e.streaming && !e.split.empty())
    t.fail(tab.get("split"), "'split' selects rows of map-style data; a streamed entry reads its shards whole (name the shards in `path`)");
  if (!e.eval_split.empty() && tab.get("eval_fraction"))
    t.fail(tab.get("eval_split"), "'eval_split' and 'eval_fraction' both choose the evaluation rows: keep one");
  if (!e.eval_split.empty() && e.streaming && e.eval_path.empty())
    t.fail(tab.get("eval_split"), "'eval_split' of a streamed `path` would evaluate on rows the stream trains on: give eval_path");
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
