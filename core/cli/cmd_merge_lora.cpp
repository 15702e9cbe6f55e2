// axengine merge-lora [--model DIR] --adapter DIR --out DIR [--dtype fp32|bf16|fp16] [--config FILE] [--set K=V]...
// The model families come from the engine's start path: the built-ins and the plugins found (configured by
// --config / --set as in a run), so a model a plugin adds merges too. How the base was packed (QLoRA), so that
// the adapter is merged into the base it learned against, comes from the adapter's training record, or the
// run config (which must agree with the record).
#include <iostream>
#include <optional>

#include "axengine/config.hpp"
#include "axengine/dir_lock.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/hub_cache.hpp"
#include "axengine/models.hpp"
#include "command.hpp"

namespace {

int run_merge_lora(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  po::options_description opts("merge-lora options");
  opts.add_options()("model", po::value<std::string>(), "base HF model directory, or a hub ID in the hub cache (Qwen/Qwen3-8B[@revision]) (default: --config's model.path, else the one the adapter's axengine_training.json names)")(
      "adapter", po::value<std::string>(), "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")(
      "out", po::value<std::string>(), "output HF model directory (must not exist or be empty)")(
      "dtype", po::value<std::string>()->default_value(""), "output dtype: fp32, bf16, fp16 (default: as the base)")(
      "config,c", po::value<std::string>(),
      "the run config the adapter was trained with: its plugins and their tables; its [model] weight_format, "
      "skip_modules, quant_blocksize and double_quant rebuild the packed (QLoRA) base the adapter learned against, "
      "which is dequantised (they must agree with the adapter's axengine_training.json, which is used without "
      "--config); its model.path is the default --model")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine merge-lora [--model DIR] --adapter DIR --out DIR [--dtype D] [--config RUN.toml]",
                              args, opts, vm))
    return 0;
  ax::StartOptions start;
  if (vm.count("config")) start.config_file = vm["config"].as<std::string>();
  if (vm.count("set")) start.overrides = vm["set"].as<std::vector<std::string>>();
  auto engine = ax::Engine::start(start);
  // Without --config the adapter's training record (axengine_training.json) says how the base was packed and
  // which base it is; with one, the record must agree.
  std::optional<ax::WeightPolicy> weights;
  std::string model = vm.count("model") ? vm["model"].as<std::string>() : "";
  if (vm.count("config")) {
    weights = ax::weight_policy(engine->config.model);
    if (model.empty()) model = engine->config.model.path;
  }
  if (!model.empty()) model = ax::hub::require_model_dir(model);  // a directory or a hub ID (the config's is resolved already)
  for (const char* k : {"adapter", "out"})
    if (!vm.count(k)) throw ax::UsageError(std::string("merge-lora: --") + k + " is required");
  // One merge into --out at a time (both would write the same .tmp- sibling): refused naming the other process.
  const std::string out = vm["out"].as<std::string>();
  ax::DirLock lock(ax::lock_file_beside(out), "merge-lora --out " + out);
  ax::merge_lora_dir(engine->registry, model, vm["adapter"].as<std::string>(), vm["out"].as<std::string>(),
                     vm["dtype"].as<std::string>(), weights);
  std::cout << "wrote merged model to " << vm["out"].as<std::string>() << "\n";
  return 0;
}

ax::cli::CommandRegistrar reg({"merge-lora", "fold a PEFT LoRA adapter into a model and write an HF model dir", run_merge_lora});

}  // namespace
