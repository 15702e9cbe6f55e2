// axengine run --config FILE [--set k=v]...: the main job.
#include <iostream>

#include "axengine/engine.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;

int run_run(const std::vector<std::string>& args) {
  po::options_description opts("run options");
  opts.add_options()("config,c", po::value<std::string>(), "run config (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set train.max_steps=10");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine run --config FILE [--set KEY=VALUE]...", args, opts, vm)) return 0;
  if (!vm.count("config")) throw ax::UsageError("run: --config FILE is required");
  auto sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
  auto engine = ax::Engine::start(vm["config"].as<std::string>(), sets);

  std::size_t loaded = 0, refused = 0;
  for (const auto& r : engine->plugins->reports()) {
    if (r.status == ax::PluginReport::Status::loaded) {
      ++loaded;
      ax::log::info(ax::str("plugin ", r.name, " ", r.version, " (", r.origin, ": ", r.path, ")"));
    }
    refused += r.status == ax::PluginReport::Status::refused;
  }
  ax::log::info(ax::str("config ", engine->config.file, " ok; device ", engine->device.arch_name(), " (", engine->device.name,
                        "), dtype ", engine->dtype, "; plugins: ", loaded, " loaded, ", refused, " refused"));
  std::cout << ax::format_resolution_table(engine->resolve_all(), engine->device);
  return 0;
}

ax::cli::CommandRegistrar reg({"run", "run a job from a config: validate, load plugins, resolve kernels, train", run_run});

}  // namespace
