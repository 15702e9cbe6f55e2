// The options `axengine generate` and `axengine chat` share: model, sampling, device (axengine/generation.hpp).
#pragma once
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/generation.hpp"
#include "axengine/hub_cache.hpp"

namespace ax::cli {

inline void add_generation_options(boost::program_options::options_description& opts) {
  namespace po = boost::program_options;
  opts.add_options()("model", po::value<std::string>(), "HF model directory (a base, or a merged one), or a hub ID in the hub cache (Qwen/Qwen3-8B[@revision])")(
      "adapter", po::value<std::string>(), "PEFT LoRA adapter directory applied on --model")(
      "max-new-tokens", po::value<int64_t>()->default_value(256), "most tokens generated per answer")(
      "temperature", po::value<double>()->default_value(0.0), "sampling temperature; 0 = greedy")(
      "top-p", po::value<double>()->default_value(1.0), "nucleus sampling: keep the likeliest tokens up to this mass")(
      "top-k", po::value<int64_t>()->default_value(0), "keep the k likeliest tokens; 0 = all")(
      "seed", po::value<uint64_t>()->default_value(0), "sampling seed (prompt or turn i uses seed + i)")(
      "stop", po::value<std::vector<std::string>>()->composing(),
      "stop string (repeatable): the answer ends where its text contains one, which is cut from it")(
      "template-kwargs", po::value<std::vector<std::string>>()->composing(),
      "chat template variables: a JSON object or key=value, repeatable (e.g. enable_thinking=false); default: "
      "the training run's template_kwargs when --adapter (or a merged --model) records them")(
      "max-prompt-tokens", po::value<int64_t>()->default_value(0),
      "longest prompt accepted, in tokens (a chat: the whole conversation); 0 = the model's max_position_embeddings")(
      "image", po::value<std::vector<std::string>>()->composing(),
      "an image file (repeatable) for a vision-language model: image parts, in order, before the text of the first "
      "user message of every chat prompt (generate) or conversation (chat)")(
      "device", po::value<std::string>(), "cpu or cuda (default: CUDA when available)")(
      "dtype", po::value<std::string>(), "compute dtype: fp32, bf16, fp16 (default: bf16 on CUDA, fp32 on CPU)")(
      "config,c", po::value<std::string>(), "a run config: its plugins, [kernels] and [device] tables apply")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key");
}

// The job the options describe, and the engine start: --device / --dtype become the run config's keys, so
// device detection and kernel selection treat them exactly as a run does.
inline GenerationJob generation_job(const std::string& command, const boost::program_options::variables_map& vm,
                                    StartOptions& start) {
  if (!vm.count("model")) throw UsageError(command + ": --model DIR is required");
  GenerationJob j;
  j.model_dir = hub::require_model_dir(vm["model"].as<std::string>());  // a directory or a hub ID
  if (vm.count("adapter")) j.adapter_dir = vm["adapter"].as<std::string>();
  j.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
  j.sampling.temperature = vm["temperature"].as<double>();
  j.sampling.top_p = vm["top-p"].as<double>();
  j.sampling.top_k = vm["top-k"].as<int64_t>();
  j.sampling.seed = vm["seed"].as<uint64_t>();
  if (vm.count("stop")) j.stop = vm["stop"].as<std::vector<std::string>>();
  if (vm.count("template-kwargs")) j.template_kwargs = ax::parse_template_kwargs(vm["template-kwargs"].as<std::vector<std::string>>());
  j.max_prompt_tokens = vm["max-prompt-tokens"].as<int64_t>();
  if (vm.count("image")) j.images = vm["image"].as<std::vector<std::string>>();
  if (vm.count("config")) start.config_file = vm["config"].as<std::string>();
  if (vm.count("set")) start.overrides = vm["set"].as<std::vector<std::string>>();
  if (vm.count("device")) start.overrides.push_back("device.type=" + vm["device"].as<std::string>());
  if (vm.count("dtype")) start.overrides.push_back("model.dtype=" + vm["dtype"].as<std::string>());
  return j;
}

}  // namespace ax::cli
