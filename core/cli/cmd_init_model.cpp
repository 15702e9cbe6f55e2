// axengine init-model --preset NAME --out DIR [--seed N]
#include <iostream>

#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "command.hpp"

namespace {

int run_init_model(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("init-model options");
  opts.add_options()("preset", po::value<std::string>(), ("model preset: " + ax::join(ax::model_presets(), ", ")).c_str())(
      "out", po::value<std::string>(), "output directory (must not exist or be empty)")(
      "seed", po::value<uint64_t>()->default_value(0), "random seed for the weights");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine init-model --preset NAME --out DIR [--seed N]", args, opts, vm)) return 0;
  if (!vm.count("preset")) throw ax::UsageError("init-model: --preset is required (" + ax::join(ax::model_presets(), ", ") + ")");
  if (!vm.count("out")) throw ax::UsageError("init-model: --out DIR is required");
  ax::init_model_dir(vm["preset"].as<std::string>(), vm["out"].as<std::string>(), vm["seed"].as<uint64_t>());
  std::cout << "wrote " << vm["preset"].as<std::string>() << " to " << vm["out"].as<std::string>() << "\n";
  return 0;
}

ax::cli::CommandRegistrar reg({"init-model", "write a random-init HF model dir from a preset", run_init_model});

}  // namespace
