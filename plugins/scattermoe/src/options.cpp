// See options.hpp.
#include "options.hpp"

#include <algorithm>
#include <filesystem>

#include <axengine/strings.hpp>

#include "../kernels/tile_configs.hpp"

namespace ax::scattermoe {

std::vector<int> parse_tiles(const std::string& text, std::string& error) {
  std::vector<int> ids;
  error.clear();
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string name = text.substr(start, comma - start);
    start = comma + 1;
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (name.empty()) continue;
    const int id = tile_id(name);
    if (id < 0) {
      std::vector<std::string> known;
      for (const auto& c : kTileConfigs) known.push_back(c.name);
      const std::string hint = closest(name, known);
      error = str("unknown tile configuration '", name, "' (known: ", join(known, ", "), ")",
                  hint.empty() ? "" : str("; did you mean '", hint, "'?"));
      return {};
    }
    for (int other : ids)
      if (kTileConfigs[other].family == kTileConfigs[id].family) {
        error = str("'", kTileConfigs[other].name, "' and '", name, "' force the same kind of GEMM; name at most one "
                    "grouped and one gram configuration");
        return {};
      }
    ids.push_back(id);
  }
  return ids;
}

PathMode path_mode(const std::string& path) {
  if (path == "fused") return PathMode::fused;
  if (path == "split") return PathMode::split;
  if (path == "split_gmm") return PathMode::split_gmm;
  return PathMode::automatic;
}

void bind_options(TableBinder& t, Options& o) {
  t.choice("path", o.path, {"auto", "fused", "split", "split_gmm"},
           "expert GEMM layout: auto (by shape, measured rule), fused (LoRA fused into one GEMM per product), "
           "split (base GEMM by the sm_90 wgmma kernel or at::_grouped_mm, then LoRA; fused where it cannot run), "
           "split_gmm (split, always through at::_grouped_mm)");
  t.field("tile", o.tile,
          "force tile configurations wherever compiled, \"<grouped>[,<gram>]\" (e.g. \"64x128,gram128x32\"); "
          "\"\" = tuning cache, then heuristic");
  t.field("tune", o.tune,
          "time every candidate tile of each new GEMM shape on its own arguments (~0.4 s per shape at most) and "
          "store the fastest in tuning_cache; off: cache, then heuristic, no timing");
  t.field("tuning_cache", o.tuning_cache,
          "the user tuning file (relative: to the config file); \"\" = $XDG_CACHE_HOME/axengine/scattermoe-tuning.json, "
          "else ~/.cache/axengine/scattermoe-tuning.json");
  const toml::table* tbl = t.table();
  std::string error;
  parse_tiles(o.tile, error);
  if (!error.empty()) t.fail(tbl ? tbl->get("tile") : nullptr, str("'", t.path(), ".tile': ", error));
  if (tbl && tbl->get("tuning_cache") && !o.tuning_cache.empty() && std::filesystem::path(o.tuning_cache).is_relative()) {
    const auto dir = std::filesystem::path(t.context().file).parent_path();
    if (!dir.empty()) o.tuning_cache = (dir / o.tuning_cache).lexically_normal().string();
  }
}

}  // namespace ax::scattermoe
