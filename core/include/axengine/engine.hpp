// What every command that works from a run config starts with: the config, the device, a registry
// holding the built-ins and the discovered plugins, and the kernel resolution for this device.
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

class Engine {
 public:
  // Loads and validates the config, applies its log level, detects the device, registers built-ins
  // and discovers plugins (config plugins.paths, AXENGINE_PLUGIN_PATH, <exe dir>/plugins).
  static std::unique_ptr<Engine> start(const std::string& config_file, const std::vector<std::string>& overrides,
                                       const std::string& exe_dir = "");

  RunConfig config;
  DeviceInfo device;
  std::string dtype;  // the compute dtype on this device
  Registry registry;
  std::unique_ptr<PluginLoader> plugins;

  // The resolution of every known op for this run's device, dtype and weight format.
  std::vector<Resolution> resolve_all() const;
  std::shared_ptr<KernelSet> kernel_set() const;

 private:
  Engine() = default;
};

// The table `run` and `plugins explain` print: op -> chosen backend, and why others were passed over.
std::string format_resolution_table(const std::vector<Resolution>& resolutions, const DeviceInfo& device);

}  // namespace ax
