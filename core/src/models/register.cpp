#include "models/register.hpp"

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/model_check.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/decoder_plan.hpp"
#include "models/family.hpp"
#include "models/gemma3_mm.hpp"
#include "models/qwen2_5_vl.hpp"
#include "models/qwen3_vl.hpp"
#include "models/unfrozen.hpp"

namespace ax::models {
namespace fs = std::filesystem;

namespace {

class DecoderFamily : public ModelFamily, public ModelFamilyCheck {
 public:
  explicit DecoderFamily(std::string type) : type_(std::move(type)) {}
  std::unique_ptr<Model> load(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override {
    return load_with(hf_config, o, nullptr);
  }
  // `layers`: DecoderModel's owner of the layers' tensors (shard_base), handed each layer while loading.
  std::unique_ptr<Model> load_with(const nlohmann::json& hf_config, const ModelLoadOptions& o,
                                   std::shared_ptr<LayerResidency> layers) const {
    HfConfig cfg = parse_config(hf_config, o);
    auto dtype = parse_model_dtype(o);
    at::Device device(o.device);
    int64_t left_out = 0;
    auto ckpt = checkpoint_text_view(cfg, safetensors::Checkpoint::open_dir(o.dir), &left_out);
    if (left_out > 0)
      log::info(str(o.dir, ": a multimodal checkpoint: its language model is read; ", left_out,
                    " other tensors (model.visual.*: the vision tower, ...) are not used"));
    auto model = std::make_unique<DecoderModel>(cfg, ckpt, *dtype, device, o.kernels, o.weights, o.expert_parallel,
                                                std::move(layers));
    model->set_activation_checkpointing(o.activation_checkpointing);
    if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
    LoraSet lora;
    if (o.lora) lora = make_lora(*o.lora, cfg.model_type, model->lora_sites(), *dtype, device);
    if (!o.adapter_dir.empty()) lora = load_peft(o.adapter_dir, cfg.model_type, model->lora_sites(), *dtype, device);
    if (o.lora || !o.adapter_dir.empty()) {
      lora = model->shard_expert_lora(std::move(lora));  // expert parallelism: this rank's experts' factors
      fs::path base = fs::absolute(o.dir).lexically_normal();
      lora.base_model = (base.has_filename() ? base : base.parent_path()).string();  // no trailing '/'

      std::map<std::string, at::Tensor> saved = std::move(lora.saved);  // an adapter's modules_to_save
      model->set_lora(std::move(lora));
      model->restore_saved(saved, o.adapter_dir);
    }
    log::info(str("loaded ", cfg.model_type, " model from ", o.dir, " (", cfg.num_layers, " layers, hidden ",
                  cfg.hidden_size, cfg.num_experts ? str(", ", cfg.num_experts, " experts top-", cfg.top_k) : "", ")"));
    return model;
  }

  // What load refuses, in load's order and with its messages, minus reading weights: the checkpoint is
  // opened (headers only: safetensors are memory-mapped), the LoRA plan is made from the config's sites, and an
  // adapter to continue is read on the CPU (adapters are small).
  ModelCheck check(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override {
    HfConfig cfg = parse_config(hf_config, o);
    auto dtype = parse_model_dtype(o);
    auto ckpt = checkpoint_text_view(cfg, safetensors::Checkpoint::open_dir(o.dir));
    // The checkpoint against the config, the weight plan, and every call DecoderModel will resolve and make
    // (models/decoder_plan.hpp: what its constructor resolves too).
    const DecoderPlan plan = plan_decoder(cfg, ckpt, o.weights);
    if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
    ModelCheck out;
    out.family = cfg.model_type;
    out.summary = str(cfg.model_type, ": ", cfg.num_layers, " layers, hidden ", cfg.hidden_size,
                      cfg.num_experts ? str(", ", cfg.num_experts, " experts top-", cfg.top_k) : "");
    out.ops = plan.calls;
    out.quantize = plan.quantize;
    if (o.lora) out.lora_modules = static_cast<int64_t>(plan_lora(*o.lora, cfg.model_type, lora_sites(cfg)).size());
    if (!o.adapter_dir.empty()) {
      const LoraSet adapter = load_peft(o.adapter_dir, cfg.model_type, lora_sites(cfg), *dtype, at::kCPU);
      out.lora_modules = static_cast<int64_t>(adapter.modules.size());
      check_saved(cfg, adapter.saved, o.adapter_dir);  // its modules_to_save, as restore_saved checks them
    }
    return out;
  }

 private:
  HfConfig parse_config(const nlohmann::json& hf_config, const ModelLoadOptions& o) const {
    HfConfig cfg = parse_hf_config(hf_config, (fs::path(o.dir) / "config.json").string());
    if (cfg.model_type != type_)
      throw UsageError(str(cfg.source, ": model_type '", cfg.model_type, "' given to the ", type_, " family"));
    return cfg;
  }
  static std::optional<at::ScalarType> parse_model_dtype(const ModelLoadOptions& o) {
    auto dtype = ops::parse_dtype(o.dtype);
    if (!dtype || *dtype == at::kDouble) throw UsageError(str("model dtype must be fp32, bf16 or fp16, got '", o.dtype, "'"));
    return dtype;
  }

  std::string type_;
};

}  // namespace

void register_builtin_models(Registry& registry) {
  for (const Family* f : families()) {  // models/families/<name>.cpp
    Provider p;
    p.info.kind = ProviderKind::model;
    p.info.name = f->name;
    p.info.summary = f->summary;
    p.object = std::shared_ptr<ModelFamily>(std::make_shared<DecoderFamily>(f->name));  // the ModelFamily pointer, as get<> reads it
    registry.add(p);
    for (const auto& alias : f->also_types) {  // another model_type of the same description (qwen3_5_text)
      p.info.name = alias;
      registry.add(p);
    }
  }
  register_qwen2_5_vl(registry);  // models/qwen2_5_vl_model.cpp
  register_qwen3_vl(registry);  // models/qwen3_vl_model.cpp
  register_qwen3_vl_moe(registry);  // models/qwen3_vl_moe.cpp
  register_gemma3_mm(registry);   // models/gemma3_mm.cpp
}

}  // namespace ax::models

namespace ax {
namespace fs = std::filesystem;

namespace {

struct FamilyOf {
  nlohmann::json hf_config;  // config.json, token ids completed from generation_config.json
  std::shared_ptr<ModelFamily> family;
};

bool config_is_moe(const nlohmann::json& j) {
  for (const char* k : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() > 0) return true;
  return false;
}

// config.json, generation_config.json and the family registered for model_type: what load and check share.
FamilyOf family_of_dir(const Registry& registry, const ModelLoadOptions& options) {
  const std::string cfg_path = (fs::path(options.dir) / "config.json").string();
  if (!fs::is_directory(options.dir)) throw UsageError(str(options.dir, ": not a model directory"));
  nlohmann::json j = models::read_json_file(cfg_path);
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string())
    throw UsageError(str(cfg_path, ": 'model_type' is missing"));
  const std::string type = j["model_type"].get<std::string>();
  // generation_config.json supplies token ids the config leaves out (HF does the same at generate time).
  const std::string gen_path = (fs::path(options.dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {
    nlohmann::json g = models::read_json_file(gen_path);
    if (!g.is_object()) throw UsageError(str(gen_path, ": not a JSON object"));
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if ((!j.contains(k) || j[k].is_null()) && g.contains(k)) j[k] = g[k];
  }
  auto family = registry.get<ModelFamily>(ProviderKind::model, type);
  if (!family) {
    std::vector<std::string> known;
    for (const auto* p : registry.list(ProviderKind::model)) known.push_back(p->info.name);
    std::string hint = closest(type, known);
    // A near name is a typo fix only when it is the same kind of model: "mistral" (dense) is not a misspelt
    // "mixtral" (MoE). Whether the config is MoE shows in its expert count; the built-in families say theirs.
    const models::Family* near = models::find_family(hint);
    if (!hint.empty() && (near && near->moe) != config_is_moe(j)) hint.clear();
    // A model_type a family knows it is mistaken for (gemma3: the multimodal Gemma 3) points to that family.
    if (const std::string why = models::refused_type_message(type); !why.empty()) throw UsageError(str(cfg_path, ": ", why));
    throw UsageError(str(cfg_path, ": model_type '", type, "' has no model family (known: ", join(known, ", "), ")",
                         hint.empty() ? "" : str("; did you mean '", hint, "'?")));
  }
  return {std::move(j), std::move(family)};
}

}  // namespace

std::unique_ptr<Model> load_model(const Registry& registry, const ModelLoadOptions& options) {
  FamilyOf f = family_of_dir(registry, options);
  return f.family->load(f.hf_config, options);
}

namespace models {
std::unique_ptr<Model> load_model(const Registry& registry, const ModelLoadOptions& options,
                                  std::shared_ptr<LayerResidency> layers) {
  FamilyOf f = family_of_dir(registry, options);
  const auto* decoder = dynamic_cast<const DecoderFamily*>(f.family.get());
  if (!decoder) return nullptr;  // a family with layers of its own
  return decoder->load_with(f.hf_config, options, std::move(layers));
}
}  // namespace models

ModelCheck check_model(const Registry& registry, const ModelLoadOptions& options) {
  FamilyOf f = family_of_dir(registry, options);
  // A plugin family opts in by implementing ModelFamilyCheck too (model_check.hpp).
  if (const auto* c = dynamic_cast<const ModelFamilyCheck*>(f.family.get())) return c->check(f.hf_config, options);
  ModelCheck out;
  out.family = f.hf_config["model_type"].get<std::string>();
  out.summary = out.family + " (its family checks at load)";
  return out;
}

}  // namespace ax
