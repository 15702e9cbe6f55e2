// What every command that loads plugins starts with (run, validate, prepare, plugins, conformance, bench,
// merge-lora): the config, the device, a registry holding the built-ins and the discovered plugins, and
// the kernel resolution for this device.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "axengine/config.hpp"
#include "axengine/device.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/registry.hpp"
#include "axengine/selection.hpp"

namespace ax {

struct OpCall;  // model_check.hpp

struct StartOptions {
  std::string config_file;                // "" = no file: every default, then the overrides
  std::vector<std::string> overrides;     // --set KEY=VALUE
  std::vector<std::string> plugin_files;  // loaded first, origin "command line" (conformance --plugin)
  bool discover = true;                   // search plugins.paths, AXENGINE_PLUGIN_PATH, <exe dir>/plugins
  std::string exe_dir;                    // "" = the running executable's directory
};

class Engine {
 public:
  // Starts in two phases (config.hpp): reads the config and what discovery needs ([plugins], log level),
  // registers the built-ins and loads the plugins (the given files, then plugins.paths,
  // AXENGINE_PLUGIN_PATH, <exe dir>/plugins), then binds the whole config once — core sections and the
  // tables those plugins declared, whose options reach the plugins there — and detects the device.
  static std::unique_ptr<Engine> start(const StartOptions& options);
  static std::unique_ptr<Engine> start(const std::string& config_file, const std::vector<std::string>& overrides,
                                       const std::string& exe_dir = "");

  RunConfig config;
  DeviceInfo device;
  std::string dtype;  // the compute dtype on this device
  Registry registry;
  std::unique_ptr<PluginLoader> plugins;

  // The resolution of every call in a model's plan (ModelCheck::ops: op, weight format and layout, in this
  // engine's compute dtype), then of the quantizer for `quantize` when it is not empty: what `validate`, `run`
  // and `plugins explain` show and kernels.strict checks.
  std::vector<Resolution> resolve_calls(const std::vector<OpCall>& calls, const std::string& quantize) const;
  // Without a model to ask (a config naming none, a family without ModelFamilyCheck): every registered op, in
  // the formats model.weight_format implies (linear.lora: dense and that format), plus the quantizer.
  std::vector<Resolution> resolve_all() const;
  std::shared_ptr<KernelSet> kernel_set() const;

 private:
  Engine() = default;
};

// The table `run` and `plugins explain` print: op -> chosen backend, and why others were passed over.
std::string format_resolution_table(const std::vector<Resolution>& resolutions, const DeviceInfo& device);

}  // namespace ax
