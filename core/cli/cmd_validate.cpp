// axengine validate --config FILE [--set k=v]... [--resume] | --schema
#include <iostream>

#include "axengine/config.hpp"
#include "axengine/engine.hpp"
#include "axengine/training.hpp"
#include "command.hpp"

namespace {

int run_validate(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("validate options");
  opts.add_options()("config,c", po::value<std::string>(), "run config (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a key: --set train.lr=1e-4")(
      "resume", po::bool_switch(), "check as `run --resume` would (the newest checkpoint in output_dir)")(
      "overwrite", po::bool_switch(), "check as `run --overwrite` would (a non-empty output_dir is then no error)")(
      "schema", "print the reference of every config key (markdown), the found plugins' tables included, instead");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine validate --config FILE [--set KEY=VALUE]... [--resume | --overwrite] | --schema", args, opts, vm))
    return 0;
  if (vm.count("schema")) {
    auto engine = ax::Engine::start(ax::StartOptions{});  // no config: the plugins found the usual way
    std::cout << ax::config_reference_markdown(engine->plugins->config_tables());
    return 0;
  }
  if (!vm.count("config")) throw ax::UsageError("validate: --config FILE is required");
  auto sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
  // The same start (plugins loaded, so their tables are checked like core keys) and the same check as `run`,
  // minus loading the model and training.
  auto engine = ax::Engine::start(vm["config"].as<std::string>(), sets);
  auto lines = ax::check_run(*engine, ax::TrainOptions{vm["resume"].as<bool>(), vm["overwrite"].as<bool>()});
  std::cout << vm["config"].as<std::string>() << ": ok\n";
  for (const auto& l : lines) std::cout << "  " << l << "\n";
  return 0;
}

ax::cli::CommandRegistrar reg({"validate", "check a run config as `run` would before its first step, without loading weights",
                               run_validate});

}  // namespace
