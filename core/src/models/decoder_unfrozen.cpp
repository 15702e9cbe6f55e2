// DecoderModel's unfrozen base parameters ([train] unfrozen_parameters, models/unfrozen.hpp): making them
// trainable, their use in the forward, adapters' modules_to_save, and the export of what trained.
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/log.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/composite.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "models/unfrozen.hpp"

namespace ax::models {
namespace fs = std::filesystem;

void DecoderModel::unfreeze(const std::vector<std::string>& patterns, at::ScalarType master, const std::string& base_dir) {
  base_dir_ = base_dir;
  if (patterns.empty()) return;
  if (ep_)
    throw UsageError("train.unfrozen_parameters cannot be used with [distributed] expert_parallel: the expert-parallel "
                     "gradient reduction covers LoRA factors only");
  if (residency_)
    throw UsageError("train.unfrozen_parameters cannot be used with [distributed] shard_base: its layers' base tensors "
                     "are frozen shards, gathered for each use");
  std::map<std::string, ops::WeightFormat> formats;
  for (const auto& [n, wt] : frozen_) formats[n] = wt.format;
  std::vector<LoraPlan> plans;
  for (const auto& m : lora_.modules) plans.push_back({m.site, m.r, m.alpha});
  for (const auto& name : resolve_unfrozen(cfg_, formats, patterns, plans)) {
    auto it = weights_.find(name);
    const at::Tensor base = it != weights_.end() ? it->second : frozen_.at(name).values;
    // A copy: the base may map the checkpoint read-only, and the optimizer updates in place.
    at::Tensor p = base.detach().to(master, /*non_blocking=*/false, /*copy=*/true).set_requires_grad(true);
    unfrozen_[name] = p;
    // The model's own slot holds the trained values from now on (named_parameters, merged_state_dict read it).
    if (it != weights_.end()) it->second = p;
    else frozen_[name] = ops::WeightTensor::dense(p);
    if (cfg_.tie_word_embeddings && name == "model.embed_tokens.weight") frozen_["lm_head.weight"] = ops::WeightTensor::dense(p);
  }
}

void DecoderModel::restore_saved(const std::map<std::string, at::Tensor>& saved, const std::string& source) {
  for (const auto& [name, t] : saved) {
    at::Tensor* slot = nullptr;
    if (auto it = weights_.find(name); it != weights_.end()) slot = &it->second;
    else if (auto f = frozen_.find(name); f != frozen_.end() && !(cfg_.tie_word_embeddings && name == "lm_head.weight")) {
      if (!f->second.is_dense())
        throw UsageError(ax::str(source, ": modules_to_save tensor '", name, "': the base holds it packed (",
                             ops::to_string(f->second.format), "), it cannot be replaced"));
      slot = &f->second.values;
    }
    if (!slot) throw UsageError(ax::str(source, ": modules_to_save tensor '", name, "' is no parameter of the ", cfg_.model_type, " model"));
    if (!t.sizes().equals(slot->sizes()))
      throw UsageError(ax::str(source, ": modules_to_save tensor '", name, "' has shape ", t.sizes(), ", the model's ", slot->sizes()));
    *slot = t.to(device_, dtype_);
    if (cfg_.tie_word_embeddings && name == "model.embed_tokens.weight") frozen_["lm_head.weight"] = ops::WeightTensor::dense(*slot);
  }
}

at::Tensor DecoderModel::trained(const std::string& name) const {
  auto it = unfrozen_.find(name);
  if (it == unfrozen_.end() && cfg_.tie_word_embeddings && name == "lm_head.weight") it = unfrozen_.find("model.embed_tokens.weight");
  if (it == unfrozen_.end()) return {};
  return it->second.to(dtype_);  // differentiable; the tensor itself when the master is in the compute dtype
}

at::Tensor DecoderModel::unfrozen_linear(const at::Tensor& x, const std::string& module) {
  at::Tensor weight = trained(module + ".weight"), bias = trained(module + ".bias");
  if (!weight.defined() && !bias.defined()) return {};
  // resolve_unfrozen refused LoRA on this module: no adapter branch here.
  if (weight.defined()) {
    if (!bias.defined())
      if (auto b = weights_.find(module + ".bias"); b != weights_.end()) bias = b->second;
    return at::linear(x, weight, bias);
  }
  // Only the bias trains: the frozen weight (packed or not) through the op, the bias added after it.
  ops::LinearLoraArgs args;
  args.x = x;
  args.weight = projection(module + ".weight");
  auto op = kernels_->get<ops::LinearLora>(ops::dtype_name(dtype_), ops::to_string(args.weight.format));
  return autograd::linear_lora(op, std::move(args)) + bias;
}

void DecoderModel::save_trained(const std::string& dir) const {
  std::vector<std::string> names;
  for (const auto& [name, shape] : internal_tensors(cfg_))
    if (unfrozen_.count(name)) names.push_back(name);
  std::string why = "there is no LoRA adapter";
  if (!lora_.modules.empty()) {
    std::string partial;
    const std::vector<std::string> modules = whole_modules(cfg_, names, partial);
    if (!modules.empty()) {
      LoraSet set = lora_;  // the same tensors, plus the modules peft saves whole
      set.modules_to_save = modules;
      for (const auto& n : names) set.saved[n] = unfrozen_.at(n);
      save_peft(set, dir);
      return;
    }
    why = ax::str("peft's modules_to_save holds whole modules only, and ", partial, " is not one");
  }
  if (!told_full_export_) {
    log::info(ax::str("checkpoints are written as full model directories (model.safetensors + config.json, LoRA folded in), "
                  "not as a peft adapter: ", why));
    told_full_export_ = true;
  }
  fs::create_directories(dir);  // as save_peft does
  write_model_dir(*this, base_dir_, dir, checkpoint_dtype(base_dir_));
}

at::ScalarType checkpoint_dtype(const std::string& model_dir) {
  auto ckpt = safetensors::Checkpoint::open_dir(model_dir);
  // Packed weights are uint8; FP8 weights (and their fp32 scales) are dequantised: the rest says the dtype.
  for (const auto& n : ckpt.names()) {
    const at::ScalarType t = ckpt.info(n).scalar_type;
    const bool fp8_scale = n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0;
    if (at::isFloatingType(t) && !at::isFloat8Type(t) && !fp8_scale) return t;
  }
  return at::kFloat;
}

void write_model_dir(const DecoderModel& dm, const std::string& model_dir, const std::string& out_dir, at::ScalarType dtype) {
  CompositeLayout layout;
  if (dm.config().text_part) {
    // A multimodal checkpoint's text part: written under its own names, the rest (vision tower...) as stored.
    layout.text_name = [](const std::string& n) { return n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n; };
    layout.kept = [](const std::string& n) { return n.rfind("model.language_model.", 0) != 0 && n.rfind("lm_head.", 0) != 0; };
  }
  layout.tied = [&model_dir](const nlohmann::json& cfg) { return parse_hf_config(cfg, model_dir + "/config.json").tie_word_embeddings; };
  write_composite_model_dir(dm, layout, model_dir, out_dir, dtype);
}

void write_composite_model_dir(const DecoderModel& dm, const CompositeLayout& layout, const std::string& model_dir,
                               const std::string& out_dir, at::ScalarType dtype) {
  const fs::path d(out_dir);
  const char* w = "model";
  auto merged = dm.merged_state_dict(dtype);
  if (layout.text_name)
    for (auto& [name, t] : merged) name = layout.text_name(name);
  if (layout.kept) {
    auto ckpt = safetensors::Checkpoint::open_dir(model_dir);
    for (const auto& n : ckpt.names())
      if (layout.kept(n)) {
        at::Tensor t = ckpt.get(n);
        if (auto d = layout.kept_delta.find(n); d != layout.kept_delta.end()) t = t.to(at::kFloat) + d->second.to(at::kCPU);
        merged.emplace_back(n, at::isFloatingType(t.scalar_type()) ? t.to(dtype).contiguous() : t);
      }
  }
  safetensors::save((d / "model.safetensors").string(), merged, {{"format", "pt"}}, w);
  nlohmann::json cfg = read_json_file((fs::path(model_dir) / "config.json").string());
  cfg["dtype"] = dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
  if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = cfg["dtype"];
  cfg.erase("quantization_config");  // a pre-quantised base was dequantised: the model written is dense
  // A tied config whose checkpoint's own head was kept (models/tied_head.hpp): the model written holds that head.
  if (!dm.config().tie_word_embeddings && layout.tied(cfg)) {
    cfg["tie_word_embeddings"] = false;
    if (cfg.contains("text_config") && cfg["text_config"].is_object() && cfg["text_config"].contains("tie_word_embeddings"))
      cfg["text_config"]["tie_word_embeddings"] = false;
  }
  safetensors::write_file_atomic((d / "config.json").string(), cfg.dump(2) + "\n", w);
  // The processor's files too: a merged vision-language model is used with its base's image processor.
  for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "chat_template.jinja", "chat_template.json", "preprocessor_config.json", "processor_config.json",
                        "video_preprocessor_config.json"}) {
    fs::path src = fs::path(model_dir) / f;
    if (!fs::exists(src)) continue;
    // fsynced like the rest, unlike a copy; a FIFO is refused, not waited on
    safetensors::write_file_atomic((d / f).string(), read_regular_file(src.string()), w);
  }
}

}  // namespace ax::models
