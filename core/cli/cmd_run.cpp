// axengine run --config FILE [--set k=v]... [--resume]: the main job (core/src/train does the work).
#include <iostream>

#include "axengine/engine.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "axengine/training.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;

int run_run(const std::vector<std::string>& args) {
  po::options_description opts("run options");
  opts.add_options()("config,c", po::value<std::string>(), "run config (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set train.max_steps=10")(
      "resume", po::bool_switch(), "continue from the newest checkpoint in output_dir (checkpoint.resume_from = \"latest\")")(
      "overwrite", po::bool_switch(), "start afresh in a non-empty output_dir: the previous run's checkpoints, metrics and report are removed");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine run --config FILE [--set KEY=VALUE]... [--resume | --overwrite]", args, opts, vm)) return 0;
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
  ax::train_from_config(*engine, ax::TrainOptions{vm["resume"].as<bool>(), vm["overwrite"].as<bool>()});
  return 0;
}

ax::cli::CommandRegistrar reg({"run", "run a job from a config: validate, load plugins, resolve kernels, train", run_run});

}  // namespace
