// The run config (TOML) as `axengine validate` and `run` load it: parse, apply --set overrides, bind every
// section strictly (core and registered ones), then read the typed sections the trainer uses.
//
// Input: the config file, then up to four --set overrides ("key=value"), separated by kSeparator lines.
#include <cstdlib>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "data/data_config.hpp"
#include "harness.hpp"
#include "train/lora_config.hpp"
#include "train/train_config.hpp"

AX_FUZZ_HARNESS(config) {
  auto parts = ax::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 5);
  const std::string path = ax::fuzz::scratch() + "/run.toml";
  ax::fuzz::write_file(path, parts[0]);
  std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  ax::RunConfig c = ax::load_config(path, overrides);
  (void)ax::train::read_train_config(c);
  (void)ax::train::read_checkpoint_config(c);
  (void)ax::train::read_eval_config(c);
  (void)ax::train::read_profile_config(c);
  (void)ax::train::optimizer_options(c);
  (void)ax::train::read_lora_config(c);
  (void)ax::data::read_data_config(c);
  (void)ax::data::dataset_entries(c);
  (void)ax::resolve_dtype(c.model.dtype, false);
}
