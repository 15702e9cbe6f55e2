#include "gen_session.hpp"

#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "train/generate_io.hpp"

namespace ax::cli {
namespace po = boost::program_options;

void add_generation_options(po::options_description& opts) {
  opts.add_options()("model", po::value<std::string>(), "HF model directory (a base, or a merged one)")(
      "adapter", po::value<std::string>(), "PEFT LoRA adapter directory applied on --model")(
      "max-new-tokens", po::value<int64_t>()->default_value(256), "most tokens generated per answer")(
      "temperature", po::value<double>()->default_value(0.0), "sampling temperature; 0 = greedy")(
      "top-p", po::value<double>()->default_value(1.0), "nucleus sampling: keep the likeliest tokens up to this mass")(
      "top-k", po::value<int64_t>()->default_value(0), "keep the k likeliest tokens; 0 = all")(
      "seed", po::value<uint64_t>()->default_value(0), "sampling seed (prompt i uses seed + i)")(
      "stop", po::value<std::vector<std::string>>()->composing(),
      "stop string (repeatable): generation ends when the text contains it; it is cut from the output")(
      "device", po::value<std::string>(), "cpu or cuda (default: CUDA when available)")(
      "dtype", po::value<std::string>(), "compute dtype: fp32, bf16, fp16 (default: bf16 on CUDA, fp32 on CPU)")(
      "config,c", po::value<std::string>(), "a run config: its plugins, [kernels] and [device] tables apply")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key");
}

GenSession open_session(const std::string& command, const po::variables_map& vm) {
  if (!vm.count("model")) throw UsageError(command + ": --model DIR is required");
  StartOptions start;
  if (vm.count("config")) start.config_file = vm["config"].as<std::string>();
  if (vm.count("set")) start.overrides = vm["set"].as<std::vector<std::string>>();
  // --device / --dtype are the run config's keys, so that device detection and kernel selection treat them
  // exactly as a run does.
  if (vm.count("device")) start.overrides.push_back("device.type=" + vm["device"].as<std::string>());
  if (vm.count("dtype")) start.overrides.push_back("model.dtype=" + vm["dtype"].as<std::string>());
  GenSession s;
  s.engine = Engine::start(start);
  s.model_dir = vm["model"].as<std::string>();

  ModelLoadOptions o;
  o.dir = s.model_dir;
  o.dtype = s.engine->dtype;
  o.device = s.engine->device.is_cuda() ? str("cuda:", s.engine->device.index) : "cpu";
  o.kernels = s.engine->kernel_set();
  if (vm.count("adapter")) o.adapter_dir = vm["adapter"].as<std::string>();
  s.tokenizer = load_hf_tokenizer(s.model_dir);
  s.model = load_model(s.engine->registry, o);
  s.model->set_training(false);
  s.decoder = &train::decoder_of(*s.model);

  train::GenerateOptions& g = s.options;
  g.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
  g.sampling.temperature = vm["temperature"].as<double>();
  g.sampling.top_p = vm["top-p"].as<double>();
  g.sampling.top_k = vm["top-k"].as<int64_t>();
  g.sampling.seed = vm["seed"].as<uint64_t>();
  if (vm.count("stop")) g.stop = vm["stop"].as<std::vector<std::string>>();
  try {
    train::check_sampling(g.sampling);
  } catch (const UsageError& e) {
    throw UsageError(command + ": " + e.what());
  }
  g.eos_ids = train::model_eos_ids(s.model_dir);
  if (g.eos_ids.empty() && s.tokenizer->eos_id() >= 0) g.eos_ids = {s.tokenizer->eos_id()};
  if (g.eos_ids.empty()) log::warn(command + ": the model names no eos token: answers end at --max-new-tokens or a --stop string");
  const Tokenizer* tok = s.tokenizer.get();
  g.detokenize = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, /*skip_special_tokens=*/false); };
  return s;
}

}  // namespace ax::cli
