// The run config (TOML): typed sections bound strictly by config_binder.hpp. Every key, its default and
// meaning is listed in docs/config.md, which is generated from the same binding code
// (`axengine validate --schema`) and checked by a test.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "axengine/config_binder.hpp"
#include "axengine/selection.hpp"

namespace ax {

struct WeightPolicy;  // model.hpp

struct RunSection {
  std::string output_dir = "runs/default";  // resolved against the config file's directory
  int64_t seed = 42;
  std::string log_level = "info";
};

struct ModelSection {
  std::string path;                 // HF model directory; resolved against the config file's directory
  std::string dtype = "auto";       // auto: bf16 on CUDA, fp32 on CPU
  std::string weight_format = "dense";  // base weights: dense | nf4 | mxfp4 | nvfp4 (quantised at load)
  std::vector<std::string> skip_modules;  // projections kept in the compute dtype when quantising
  int64_t quant_blocksize = 64;           // nf4 absmax block
  bool double_quant = false;              // nf4: quantise the absmax too
};

struct DeviceSection {
  std::string type = "auto";  // auto | cpu | cuda
  std::string arch;           // "sm_120": select kernels as on that GPU (AXENGINE_ARCH wins)
};

struct PluginsSection {
  std::vector<std::string> paths;  // directories or .so files, searched first; resolved against the config dir
};

struct RunConfig {
  std::string file;  // the config file ("" when built from defaults)
  std::string dir;   // its directory, for relative paths
  RunSection run;
  ModelSection model;
  DeviceSection device;
  PluginsSection plugins;
  KernelPreferences kernels;
  toml::table document;  // the whole document after --set overrides, for sections bound elsewhere
};

// A config is read in two phases, so that plugins can own tables of it (Engine::start does both):
// 1. read_config parses `file` ("" = no file: every default), applies `overrides` ("a.b=value"; the value
//    is TOML, or a bare string) and binds only what plugin discovery needs: [plugins] (and [run], for the
//    log level while plugins load).
// 2. bind_config binds the whole document once: every core section and every table the loaded plugins
//    declared ([kernels.options.<backend>], [<plugin>]); unknown keys are refused everywhere alike, a
//    [kernels.options.X] that no loaded plugin owns is an error naming X; then each plugin receives its
//    bound options.
// Both throw ConfigError with file:line:column.
RunConfig read_config(const std::string& file, const std::vector<std::string>& overrides = {});
void bind_config(RunConfig& config, const std::vector<PluginConfigTable>& plugin_tables = {});
// Both phases with no plugin tables (tools and tests that load no plugin).
RunConfig load_config(const std::string& file, const std::vector<std::string>& overrides = {});

// Sections bound outside core/src/config (datasets, training, LoRA...) register here so that
// load_config validates them and the docs list them. `bind` must bind every key it accepts.
struct ConfigSection {
  std::string name;  // top-level key
  std::string doc;
  void (*bind)(TableBinder& table, RunConfig& config);
  // An array of tables ([[datasets]]): `bind` is called once per element (and once with a null table when
  // documenting the schema).
  bool array = false;
};
void register_config_section(ConfigSection section);

// Markdown reference of every key (the generated part of docs/config.md): core sections, then the tables
// of the given plugins.
std::string config_reference_markdown(const std::vector<PluginConfigTable>& plugin_tables = {});

// The [model] weight keys as a model load takes them (include model.hpp to call it).
WeightPolicy weight_policy(const ModelSection& model);

// "auto" resolved for a device: bf16 on CUDA, fp32 on CPU.
std::string resolve_dtype(const std::string& dtype, bool cuda);

}  // namespace ax
