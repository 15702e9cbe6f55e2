// axengine prepare --config FILE: tokenise the run's datasets into the prepared-data cache ahead of time.
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/training.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;

int run_prepare(const std::vector<std::string>& args) {
  po::options_description opts("prepare options");
  opts.add_options()("config,c", po::value<std::string>(), "run config (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine prepare --config FILE [--set KEY=VALUE]...", args, opts, vm)) return 0;
  if (!vm.count("config")) throw ax::UsageError("prepare: --config FILE is required");
  auto sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
  auto engine = ax::Engine::start(vm["config"].as<std::string>(), sets);
  ax::prepare_from_config(*engine);
  return 0;
}

ax::cli::CommandRegistrar reg({"prepare", "tokenise a run's datasets into the prepared-data cache (run reuses it)", run_prepare});

}  // namespace
