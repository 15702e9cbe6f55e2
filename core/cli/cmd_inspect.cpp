// axengine inspect MODEL_DIR
#include <iostream>

#include "axengine/error.hpp"
#include "axengine/hub_cache.hpp"
#include "axengine/models.hpp"
#include "command.hpp"

namespace {

int run_inspect(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("inspect options");
  opts.add_options()("model", po::value<std::string>(), "HF model directory, or a hub ID in the hub cache (Qwen/Qwen3-8B[@revision])");
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine inspect MODEL_DIR", args, opts, vm, &pos)) return 0;
  if (!vm.count("model")) throw ax::UsageError("inspect: MODEL_DIR is required");
  std::cout << ax::inspect_model_dir(ax::hub::require_model_dir(vm["model"].as<std::string>()));
  return 0;
}

ax::cli::CommandRegistrar reg({"inspect", "show a model dir's architecture, parameters, tensors and LoRA targets", run_inspect});

}  // namespace
