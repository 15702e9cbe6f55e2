// Keys every [[datasets]] entry may carry whatever its type (the engine handles the split; the types read
// `path` and `on_bad_row`), and the binder a type uses to read its own keys strictly.
#pragma once
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "axengine/config_binder.hpp"
#include "axengine/dataset.hpp"

namespace ax::data {

const std::vector<std::string>& common_dataset_keys();

struct CommonEntry {
  std::string type;
  std::string name;          // shown in logs; default: the file name
  std::string path;          // resolved against the config dir
  std::string eval_path;     // "" = split off eval_fraction instead
  std::string split;         // datasets' split syntax: "train[:20%]" (data/split_spec.hpp); "" = every row
  std::string eval_split;    // the eval rows: this split of eval_path, else of path (the engine's: data/prepare.cpp)
  double eval_fraction = -1; // < 0: use [data].eval_fraction
  std::string on_bad_row = "error";
  bool streaming = false;    // read lazily from its shards (stream_feed.hpp); needs train.max_steps
};

// Binds the common keys (and documents them when t.context().docs is set).
void bind_common_entry(TableBinder& t, CommonEntry& e);
// Reads the common keys of `entry`, resolving paths against ctx.base_dir; `t` is left for the type's own keys.
CommonEntry read_common_entry(TableBinder& t, const DatasetContext& ctx);

std::string resolve_against(const std::string& base_dir, const std::string& path);

}  // namespace ax::data
