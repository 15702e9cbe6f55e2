// The scattermoe backend's options: the table [kernels.options.scattermoe] of the run config, bound by the
// engine with the rest of the config (docs/plugins/scattermoe.md, "Options"). Plain C++ (no CUDA).
#pragma once
#include <string>
#include <vector>

#include <axengine/config_binder.hpp>

namespace ax::scattermoe {

// How the expert GEMMs are laid out (glue.hpp): by the shape rule, or one path forced for comparisons.
// split_gmm: the split path without our wgmma kernel (always _grouped_mm + the LoRA-add pass).
enum class PathMode { automatic, fused, split, split_gmm };

struct Options {
  std::string path = "auto";  // auto | fused | split | split_gmm
  std::string tile;           // "<name>[,<gram name>]": forced tile configurations (kernels/tile_configs.hpp)
  bool tune = false;          // time the candidate tiles of each new shape, store the fastest
  std::string tuning_cache;   // the user tuning file ("" = default_user_cache_path()); relative: to the config
};

// Binds the table; an unknown path or tile name (or two tiles of one family) is an error at its location.
void bind_options(TableBinder& table, Options& options);

PathMode path_mode(const std::string& path);  // of a bound (checked) Options::path
// The tile ids a bound Options::tile names, in order; `error` gets why when the list is not valid.
std::vector<int> parse_tiles(const std::string& text, std::string& error);

}  // namespace ax::scattermoe
