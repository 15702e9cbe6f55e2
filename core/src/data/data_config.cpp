#include "data/data_config.hpp"

#include <cstdlib>

#include "axengine/strings.hpp"
#include "data/entry.hpp"
#include "data/types.hpp"

namespace ax::data {
namespace {

void bind_data(TableBinder& t, DataConfig& d) {
  t.bounded("sequence_len", d.sequence_len, 8, 1 << 20, "tokens per packed row: several samples share a row, attention never crosses them");
  t.field("eval_fraction", d.eval_fraction, "fraction of each dataset held out for evaluation, unless the entry sets eval_path or its own eval_fraction");
  t.field("cache_dir", d.cache_dir, "where tokenised datasets are cached, keyed by dataset config + tokenizer (default ~/.cache/axengine/prepared; env AXENGINE_CACHE_DIR)");
  t.field("cache", d.cache, "reuse / write the prepared-data cache");
  t.bounded("prefetch_steps", d.prefetch_steps, 0, 16, "a streamed dataset (streaming = true): steps whose rows are read, tokenised and their images decoded on a background thread while the current step trains; 0 reads each step on the training thread just before it; same rows, order and losses either way; refused for map-style data (docs/datasets.md, \"Streaming\")");
  if (d.eval_fraction < 0 || d.eval_fraction >= 1)
    t.fail(t.table() ? t.table()->get("eval_fraction") : nullptr, "'data.eval_fraction' must be in [0, 1)");
}

void bind_data_section(TableBinder& t, RunConfig&) {
  DataConfig d;
  bind_data(t, d);
}

void bind_dataset_entry(TableBinder& t, RunConfig&) {
  CommonEntry e;
  bind_common_entry(t, e);
  if (!t.table()) {  // documenting: list the built-in types' own keys too
    document_completion_keys(t);
    document_pretokenized_keys(t);
    document_alpaca_keys(t, /*shared=*/false);
    document_chat_template_keys(t);
    return;
  }
  if (e.type.empty()) t.fail(nullptr, "this [[datasets]] entry has no 'type' (completion, pretokenized, ...)");
  if (e.path.empty()) t.fail(nullptr, "this [[datasets]] entry has no 'path'");
  // Built-in types are checked strictly here; a plugin's type checks its own keys when it opens the entry.
  if (e.type == "completion") {
    document_completion_keys(t);
  } else if (e.type == "pretokenized") {
    document_pretokenized_keys(t);
  } else if (e.type == "alpaca") {
    document_alpaca_keys(t, /*shared=*/true);
  } else if (e.type == "chat_template") {
    document_chat_template_keys(t);
  } else {
    for (const auto& [k, v] : *t.table()) t.accept(std::string(k.str()));
  }
}

struct Registrar {
  Registrar() {
    register_config_section({"data", "how datasets become training rows: packing, evaluation split, cache", bind_data_section});
    register_config_section({"datasets", "one entry per dataset ([[datasets]]: JSONL, JSON or Parquet files); every entry is used, all are mixed", bind_dataset_entry, true});
  }
} registrar;

}  // namespace

DataConfig read_data_config(const RunConfig& config) {
  DataConfig d;
  const toml::node* n = config.document.get("data");
  TableBinder t(n ? n->as_table() : nullptr, "data", BindContext{config.file, nullptr});
  bind_data(t, d);
  d.cache_dir = resolve_against(config.dir, d.cache_dir);
  if (d.cache_dir.empty()) d.cache_dir = default_cache_dir();
  return d;
}

std::vector<const toml::table*> dataset_entries(const RunConfig& config) {
  std::vector<const toml::table*> out;
  if (const toml::array* a = config.document["datasets"].as_array())
    for (const auto& e : *a)
      if (e.is_table()) out.push_back(e.as_table());
  return out;
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("AXENGINE_CACHE_DIR"); d && *d) return ax::str(d, "/prepared");
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return ax::str(x, "/axengine/prepared");
  if (const char* h = std::getenv("HOME"); h && *h) return ax::str(h, "/.cache/axengine/prepared");
  return "/tmp/axengine-prepared";
}

}  // namespace ax::data
