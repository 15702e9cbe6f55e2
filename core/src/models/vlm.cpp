// The vision-language families' shared base (models/vlm.hpp).
#include "models/vlm.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/strings.hpp"
#include "models/decoder_plan.hpp"
#include "models/lora.hpp"
#include "models/vision_lora.hpp"

namespace ax::models {
namespace fs = std::filesystem;

const std::vector<const VlDescription*>& vl_descriptions() {
  static const std::vector<const VlDescription*> all{&qwen2_5_vl_description(), &qwen3_vl_description(), &qwen3_vl_moe_description(),
                                                          &gemma3_mm_description()};
  return all;
}

const VlDescription* find_vl_description(const std::string& model_type) {
  for (const VlDescription* d : vl_descriptions())
    if (d->family == model_type) return d;
  return nullptr;
}

safetensors::Checkpoint vl_text_view(const VlDescription& d, const safetensors::Checkpoint& ckpt) { return ckpt.renamed(d.text_name); }
safetensors::Checkpoint vl_vision_view(const VlDescription& d, const safetensors::Checkpoint& ckpt) { return ckpt.renamed(d.vision_name); }
safetensors::Checkpoint vl_view(const VlDescription& d, const safetensors::Checkpoint& ckpt) {
  return ckpt.renamed([&d](const std::string& n) -> std::optional<std::string> {
    if (auto t = d.text_name(n)) return t;
    if (auto v = d.vision_name(n)) return v;
    return n;
  });
}

std::vector<LoraSite> vl_lora_sites(const HfConfig& text) {
  std::vector<LoraSite> sites = lora_sites(text);
  for (auto& s : sites) s.peft_path = "model.language_model." + s.path.substr(6);  // "model." -> "model.language_model."
  return sites;
}

at::ScalarType vl_model_dtype(const ModelLoadOptions& o) {
  auto dtype = ops::parse_dtype(o.dtype);
  if (!dtype || *dtype == at::kDouble) throw UsageError(str("model dtype must be fp32, bf16 or fp16, got '", o.dtype, "'"));
  return *dtype;
}

// --- VlModel ---

void VlModel::load_text(const HfConfig& text, const safetensors::Checkpoint& ckpt, at::ScalarType dtype,
                        std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights) {
  text_ = std::make_unique<DecoderModel>(text, vl_text_view(desc_, ckpt), dtype, device_, std::move(kernels), weights);
}

void VlModel::warn_unused(const safetensors::Checkpoint& vis, const std::vector<std::string>& used_keys) const {
  std::set<std::string> used(used_keys.begin(), used_keys.end());
  for (const auto& n : vis.names())
    if (!used.count(n)) log::warn(str(vis.file_of(n), ": tensor '", n, "' is not used by the ", desc_.family, " ", desc_.vision_what));
}

std::vector<std::pair<std::string, at::Tensor>> VlModel::named_parameters() const {
  auto out = text_->named_parameters();
  for (const auto& p : vision_weights()) out.push_back(p);
  for (const auto& p : vision_lora_.parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> VlModel::trainable_parameters() const {
  auto out = text_->trainable_parameters();
  for (const auto& p : vision_lora_.parameters()) out.push_back(p);
  return out;
}

void VlModel::set_training(bool training) {
  text_->set_training(training);
  vision_lora_.set_training(training);
}

void VlModel::save_adapter(const std::string& dir) const {
  if (text_->lora().modules.empty()) throw UsageError("save_adapter: the model has no LoRA adapter");
  LoraSet all = text_->lora();  // the same tensors, the vision side's modules added
  for (const auto& m : vision_lora_.lora().modules) all.modules.push_back(m);
  save_peft(all, dir);
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  nlohmann::json j = read_json_file(path);
  if (vision_lora_.empty()) {
    j["exclude_modules"] = desc_.exclude;
  } else {
    // One target_modules for both sides: the language model's leaves and the vision side's names; every other
    // module those names select in peft's model is excluded.
    std::set<std::string> names(vision_lora_.lora().spec.targets.begin(), vision_lora_.lora().spec.targets.end());
    std::set<std::string> wrapped;
    for (const auto& m : all.modules) wrapped.insert(m.site.peft_path.empty() ? m.site.path : m.site.peft_path);
    for (const auto& m : text_->lora().modules)
      if (!m.site.experts) names.insert(m.site.leaf);
    std::vector<std::string> known = vision_module_paths_;
    for (const auto& s : vl_lora_sites(text_->config()))
      if (!s.experts) known.push_back(s.peft_path);  // experts are parameters (target_parameters), not modules
    const std::vector<std::string> target_names(names.begin(), names.end());
    const std::string exclude = exclude_regex(target_names, known, wrapped);
    j["target_modules"] = target_names;
    j["exclude_modules"] = exclude.empty() ? nlohmann::json(nullptr) : nlohmann::json(exclude);
  }
  safetensors::write_file_atomic(path, j.dump(2) + "\n", "adapter");
}

CompositeLayout VlModel::checkpoint_layout(const std::string& model_dir) const {
  // Each decoder name back to the name it is stored under (the text view's inverse). A name the base does not
  // store (qwen3_vl_moe's fused experts, written fused from a per-expert base) goes under the prefix the base
  // stores the decoder's model.* under (model. or model.language_model.), as its embeddings show.
  std::map<std::string, std::string> stored;
  for (const auto& n : safetensors::Checkpoint::open_dir(model_dir).names())
    if (auto t = desc_.text_name(n)) stored.emplace(*t, n);
  std::string prefix = "model.";
  if (auto e = stored.find("model.embed_tokens.weight"); e != stored.end())
    prefix = e->second.substr(0, e->second.size() - std::string("embed_tokens.weight").size());
  CompositeLayout l;
  l.text_name = [stored, prefix](const std::string& n) {
    auto it = stored.find(n);
    if (it != stored.end()) return it->second;
    return n.rfind("model.", 0) == 0 ? prefix + n.substr(6) : n;
  };
  l.kept = [d = &desc_](const std::string& n) { return d->vision_name(n).has_value(); };
  // The vision side's adapters fold into the tower's weights (the stored name of each site's weight).
  for (const auto& n : safetensors::Checkpoint::open_dir(model_dir).names())
    if (auto v = desc_.vision_name(n); v && v->size() > 7 && v->compare(v->size() - 7, 7, ".weight") == 0)
      if (const LoraModule* m = vision_lora_.lora().find(v->substr(0, v->size() - 7))) l.kept_delta[n] = lora_delta(*m);
  const std::string source = (fs::path(model_dir) / "config.json").string();
  l.tied = [d = &desc_, source](const nlohmann::json& cfg) { return d->inspect(cfg, source).text.tie_word_embeddings; };
  return l;
}

VlModel::Tokens VlModel::tokens(const Batch& batch) const {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2) throw UsageError("model forward: input_ids must be [B, S]");
  const int64_t B = batch.input_ids.size(0), S = batch.input_ids.size(1);
  Tokens t;
  t.T = B * S;
  if (t.T == 0) throw UsageError("model forward: empty batch");
  // Spans whose positions restart at 0: the packed samples and the padding (cu_seqlens), else whole rows.
  t.cu = batch.cu_seqlens_host.defined() ? batch.cu_seqlens_host
         : batch.cu_seqlens.defined()    ? batch.cu_seqlens.to(at::kCPU)
                                         : at::arange(B + 1, at::kLong) * S;
  at::Tensor c = t.cu.to(at::kLong);
  if (c.dim() != 1 || c.size(0) < 2 || c[0].item<int64_t>() != 0 || c[-1].item<int64_t>() != t.T ||
      (c.narrow(0, 1, c.size(0) - 1) < c.narrow(0, 0, c.size(0) - 1)).any().item<bool>())
    throw UsageError(str("model forward: cu_seqlens must rise from 0 to B*S = ", t.T));
  t.ids_host = (batch.input_ids_host.defined() ? batch.input_ids_host : batch.input_ids).to(at::kCPU, at::kLong).reshape({t.T});
  const int64_t lo = t.ids_host.min().item<int64_t>(), hi = t.ids_host.max().item<int64_t>();
  if (lo < 0 || hi >= text_->config().vocab_size)
    throw UsageError(str("model forward: token ids must be in [0, ", text_->config().vocab_size, ")"));
  t.ids = batch.input_ids.to(device_, at::kLong).reshape({t.T});
  return t;
}

// --- VlFamily ---

namespace {

// An adapter's modules_to_save: the language model's base tensors sit under other names here
// (model.language_model.), and nothing maps them yet.
void refuse_saved(const LoraSet& lora, const std::string& adapter_dir, const std::string& family) {
  if (!lora.saved.empty())
    throw UsageError(str(adapter_dir, ": modules_to_save (", join(lora.modules_to_save, ", "), ") is not supported for ", family));
}

}  // namespace

void VlFamily::check_lora_request(const ModelLoadOptions& o) const {
  if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
  if (o.lora)  // lora.targets are the language model's; the vision side's are lora.vision_targets
    for (const auto& t : o.lora->targets)
      for (const auto& v : desc_.vision_targets)
        if (t.find(v) != std::string::npos)
          throw UsageError(str("lora: target '", t, "' names a module of the ", desc_.family, " ", desc_.vision_what,
                               "; lora.targets are the language model's modules, name the ", desc_.vision_what,
                               "'s in lora.vision_targets"));
}

std::vector<LoraSite> VlFamily::selected_vision_sites(const nlohmann::json& hf_config, const ModelLoadOptions& o) const {
  const std::vector<std::string> targets = o.lora ? o.lora->vision_targets : std::vector<std::string>{};
  if (targets.empty()) return {};
  const VlInspect vis = desc_.inspect(hf_config, (fs::path(o.dir) / "config.json").string());
  return select_vision_sites(targets, vision_lora_sites(vis), vision_modules(vis), desc_.family, desc_.vision_what);
}

VlFamily::Adapters VlFamily::plan_adapters(const nlohmann::json& hf_config, const ModelLoadOptions& o, const HfConfig& text,
                                           at::ScalarType dtype, at::Device device) const {
  const auto text_sites = vl_lora_sites(text);
  const VlInspect vis = desc_.inspect(hf_config, (fs::path(o.dir) / "config.json").string());
  const auto vision_sites = vision_lora_sites(vis);
  Adapters out;
  if (o.lora) {
    LoraSpec spec = *o.lora;
    spec.vision_targets.clear();  // the language model's adapter; the vision side's is planned here
    out.text = make_lora(spec, desc_.lora_family, text_sites, dtype, device);
    if (!o.lora->vision_targets.empty()) {
      spec.targets = o.lora->vision_targets;
      spec.seed = o.lora->seed + 1;  // the vision side's A from a stream of its own
      out.vision = make_lora(spec, desc_.lora_family, selected_vision_sites(hf_config, o), dtype, device);
    }
    return out;
  }
  // An adapter (ours or peft's): its target_modules over both sides' sites, less what its exclude_modules names,
  // as peft selects them on transformers' model.
  const std::string cfg_path = (fs::path(o.adapter_dir) / "adapter_config.json").string();
  const nlohmann::json cfg = read_json_file(cfg_path);
  const auto excluded = adapter_excludes(cfg.is_object() ? cfg : nlohmann::json::object(), cfg_path);
  std::vector<LoraSite> sites;
  std::set<std::string> vision_paths;
  for (const auto& s : text_sites)
    if (!excluded(s.peft_path)) sites.push_back(s);
  for (const auto& s : vision_sites)
    if (!excluded(s.peft_path)) sites.push_back(s), vision_paths.insert(s.path);
  LoraSet all = load_peft(o.adapter_dir, desc_.lora_family, sites, dtype, device);
  refuse_saved(all, o.adapter_dir, desc_.family);
  out.text = all;
  out.vision = all;
  std::erase_if(out.text.modules, [&](const LoraModule& m) { return vision_paths.count(m.site.path) != 0; });
  std::erase_if(out.vision.modules, [&](const LoraModule& m) { return vision_paths.count(m.site.path) == 0; });
  std::set<std::string> leaves;  // the names a save writes for them
  for (const auto& m : out.vision.modules) leaves.insert(m.site.leaf);
  out.vision.spec.targets.assign(leaves.begin(), leaves.end());
  if (out.text.modules.empty() && !out.vision.modules.empty())
    throw UsageError(str(o.adapter_dir, ": the adapter has modules of the ", desc_.vision_what, " only; an adapter here has the language "
                         "model's too"));
  return out;
}

std::unique_ptr<Model> VlFamily::load(const nlohmann::json& hf_config, const ModelLoadOptions& o) const {
  const auto dtype = vl_model_dtype(o);
  check_lora_request(o);
  auto model = build(hf_config, o, safetensors::Checkpoint::open_dir(o.dir), dtype);
  DecoderModel& text = model->text();
  text.set_activation_checkpointing(o.activation_checkpointing);
  if (o.lora || !o.adapter_dir.empty()) {
    Adapters a = plan_adapters(hf_config, o, text.config(), dtype, at::Device(o.device));
    fs::path base = fs::absolute(o.dir).lexically_normal();
    a.text.base_model = (base.has_filename() ? base : base.parent_path()).string();
    text.set_lora(std::move(a.text));
    if (!a.vision.modules.empty()) {
      std::vector<std::string> paths;
      for (const auto& m : vision_modules(desc_.inspect(hf_config, (fs::path(o.dir) / "config.json").string())))
        paths.push_back(vision_peft_path(m));
      log::info(str(desc_.family, ": LoRA on ", a.vision.modules.size(), " modules of the ", desc_.vision_what));
      model->set_vision_lora(std::move(a.vision), std::move(paths));
    }
  }
  log::info(str("loaded ", desc_.family, " model from ", o.dir, " (", text.config().num_layers, " layers, hidden ",
                text.config().hidden_size, "; ", model->vision_summary(), ")"));
  return model;
}

ModelCheck VlFamily::check(const nlohmann::json& hf_config, const ModelLoadOptions& o) const {
  auto ckpt = safetensors::Checkpoint::open_dir(o.dir);
  // What the model's load checks and resolves, in its order: the vision side, then the language model.
  Plan p = plan(hf_config, (fs::path(o.dir) / "config.json").string(), ckpt);
  const auto dtype = vl_model_dtype(o);
  const DecoderPlan text = plan_decoder(p.text, vl_text_view(desc_, ckpt), o.weights);
  check_lora_request(o);
  ModelCheck out;
  out.family = desc_.family;
  out.summary = p.summary;
  out.ops = text.calls;
  std::erase_if(out.ops, [&](const auto& c) {
    return std::find(p.text_ops_left_out.begin(), p.text_ops_left_out.end(), c.op) != p.text_ops_left_out.end();
  });
  for (const auto& c : p.vision) out.ops.push_back(c);
  out.quantize = text.quantize;
  std::size_t n_text = 0, n_vision = 0;
  if (o.lora) {  // planned, not made: no factors allocated for a check
    LoraSpec spec = *o.lora;
    spec.vision_targets.clear();  // the language model's adapter; the vision side's counted below
    n_text = plan_lora(spec, desc_.lora_family, vl_lora_sites(p.text)).size();
    n_vision = selected_vision_sites(hf_config, o).size();
  } else if (!o.adapter_dir.empty()) {
    const Adapters a = plan_adapters(hf_config, o, p.text, dtype, at::kCPU);
    n_text = a.text.modules.size();
    n_vision = a.vision.modules.size();
  }
  if (o.lora || !o.adapter_dir.empty()) out.lora_modules = static_cast<int64_t>(n_text + n_vision);
  if (n_vision > 0) {
    out.ops.push_back({"linear.lora", "dense", ""});  // the vision side's adapted linear layers (VisionLora::linear)
    out.summary += str("; LoRA on ", n_vision, " modules of the ", desc_.vision_what);
  }
  out.ops = ordered_calls(std::move(out.ops));
  return out;
}

}  // namespace ax::models

namespace ax {

std::string model_image_processor(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path config = fs::path(dir) / "config.json";
  std::error_code ec;
  if (dir.empty() || !fs::is_regular_file(config, ec)) return "";
  const nlohmann::json j = models::read_json_file(config.string());
  const auto type = j.is_object() ? j.find("model_type") : j.end();
  if (type == j.end() || !type->is_string()) return "";
  const models::VlDescription* d = models::find_vl_description(type->get<std::string>());
  return d ? d->image_processor : "";
}

}  // namespace ax
