// The [data] section and the [[datasets]] entries of the run config.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "axengine/config.hpp"

namespace ax::data {

struct DataConfig {
  int64_t sequence_len = 512;
  double eval_fraction = 0.0;
  std::string cache_dir;  // "" = $AXENGINE_CACHE_DIR/prepared, else ~/.cache/axengine/prepared
  bool cache = true;
  int64_t prefetch_steps = 2;  // a streamed run: steps read ahead on a background thread (train/stream_prefetch.hpp)
};

DataConfig read_data_config(const RunConfig& config);
// The [[datasets]] tables in file order (none: empty).
std::vector<const toml::table*> dataset_entries(const RunConfig& config);
std::string default_cache_dir();

}  // namespace ax::data
