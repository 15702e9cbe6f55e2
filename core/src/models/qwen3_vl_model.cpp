// Qwen3-VL: the model (image splicing, deepstack) and its family (models/qwen3_vl.hpp). The rope index is
// qwen2_5_vl's (transformers' two get_rope_index agree on images); the checkpoint views and LoRA sites too.
#include <filesystem>
#include <set>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/model_check.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/strings.hpp"
#include "models/decoder_plan.hpp"
#include "models/lora.hpp"
#include "models/qwen3_vl.hpp"

namespace ax::models {
namespace fs = std::filesystem;

Qwen3VlModel::Qwen3VlModel(Qwen3VlConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                           std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights)
    : cfg_(std::move(cfg)), device_(device) {
  safetensors::Checkpoint vis = vl_vision_view(ckpt);
  vision_ = std::make_unique<Qwen3VisionTower>(cfg_.vision, vis, "visual.", dtype, device, kernels);
  std::set<std::string> used(vision_->used_keys().begin(), vision_->used_keys().end());
  for (const auto& n : vis.names())
    if (!used.count(n)) log::warn(str(vis.file_of(n), ": tensor '", n, "' is not used by the qwen3_vl vision tower"));
  text_ = std::make_unique<DecoderModel>(cfg_.text, vl_text_view(ckpt), dtype, device, std::move(kernels), weights);
}

ModelOutput Qwen3VlModel::forward(const Batch& batch, bool want_logits) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2) throw UsageError("model forward: input_ids must be [B, S]");
  const int64_t B = batch.input_ids.size(0), S = batch.input_ids.size(1), T = B * S;
  if (T == 0) throw UsageError("model forward: empty batch");
  auto pv = batch.extras.find("pixel_values");
  auto gt = batch.extras.find("image_grid_thw");
  if ((pv == batch.extras.end()) != (gt == batch.extras.end()))
    throw UsageError("qwen3_vl: a batch needs both extras \"pixel_values\" and \"image_grid_thw\", or neither");
  // As qwen2_5_vl: the rope index and the splice positions come from the host copies Batch::to keeps.
  auto grid_host = batch.extras_host.find("image_grid_thw");
  Grids grids;
  if (gt != batch.extras.end())
    grids = read_grids(grid_host != batch.extras_host.end() ? grid_host->second : gt->second, cfg_.vision.spatial_merge_size, "qwen3_vl");
  at::Tensor cu = batch.cu_seqlens_host.defined() ? batch.cu_seqlens_host
                  : batch.cu_seqlens.defined()    ? batch.cu_seqlens.to(at::kCPU)
                                                  : at::arange(B + 1, at::kLong) * S;
  at::Tensor ids_host = (batch.input_ids_host.defined() ? batch.input_ids_host : batch.input_ids).to(at::kCPU, at::kLong).reshape({T});
  {
    at::Tensor c = cu.to(at::kLong);
    if (c.dim() != 1 || c.size(0) < 2 || c[0].item<int64_t>() != 0 || c[-1].item<int64_t>() != T ||
        (c.narrow(0, 1, c.size(0) - 1) < c.narrow(0, 0, c.size(0) - 1)).any().item<bool>())
      throw UsageError(str("model forward: cu_seqlens must rise from 0 to B*S = ", T));
    const int64_t lo = ids_host.min().item<int64_t>(), hi = ids_host.max().item<int64_t>();
    if (lo < 0 || hi >= cfg_.text.vocab_size) throw UsageError(str("model forward: token ids must be in [0, ", cfg_.text.vocab_size, ")"));
  }
  at::Tensor rope_pos = to_device_async(mrope_positions(ids_host, cu, grids, cfg_.rope_tokens()), device_);
  at::Tensor ids = batch.input_ids.to(device_, at::kLong).reshape({T});
  at::Tensor embeds = text_->embed_tokens(ids);
  if (grids.empty()) return text_->forward_embeds(batch, want_logits, embeds, rope_pos);
  Qwen3VisionTower::Features feats = vision_->forward(pv->second, grids);
  // mrope_positions checked that the runs hold exactly the merged patches of every image, in order.
  at::Tensor where = to_device_async(at::nonzero(ids_host.eq(cfg_.image_token_id)).squeeze(1), device_);
  embeds = embeds.index_put({where}, feats.merged.to(embeds.scalar_type()));
  // Deepstack (Qwen3VLTextModel._deepstack_process): feature k is added to the image tokens' hidden states
  // after decoder layer k.
  auto deepstack = [&](int64_t layer, const at::Tensor& h) {
    if (layer >= static_cast<int64_t>(feats.deepstack.size())) return h;
    return h.index_add(0, where, feats.deepstack[layer].to(h.scalar_type()));
  };
  return text_->forward_embeds(batch, want_logits, embeds, rope_pos, deepstack);
}

std::vector<std::pair<std::string, at::Tensor>> Qwen3VlModel::named_parameters() const {
  auto out = text_->named_parameters();
  for (const auto& p : vision_->weights()) out.push_back(p);
  return out;
}

void Qwen3VlModel::save_adapter(const std::string& dir) const { save_vl_adapter(text_->lora(), dir); }

namespace {

// LoRA targets that name a module of the vision tower are refused: the tower is frozen (no LoRA sites). The
// language model's projections (q_proj ... down_proj) share no name with it.
void refuse_vision_targets(const LoraSpec& spec) {
  for (const auto& t : spec.targets)
    for (const char* v : {"visual", "qkv", "attn.proj", "patch_embed", "pos_embed", "merger", "linear_fc1", "linear_fc2"})
      if (t == v || t.find(v) != std::string::npos)
        throw UsageError(str("lora: target '", t, "' names a module of the qwen3_vl vision tower, which is frozen (LoRA "
                             "applies to the language model only)"));
}

// One class for the variants (qwen3_vl, qwen3_vl_moe): they differ in the decoder their config parser builds.
// LoRA is planned under the variant's name: no decoder family of ours converts its expert targets, as peft
// converts none on these models (its MoE conversion maps no qwen3_vl_moe).
class Qwen3VlFamily : public ModelFamily, public ModelFamilyCheck {
 public:
  explicit Qwen3VlFamily(Qwen3VlVariant v) : v_(std::move(v)) {}

  std::unique_ptr<Model> load(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override {
    Qwen3VlConfig cfg = v_.parse(hf_config, (fs::path(o.dir) / "config.json").string());
    const auto dtype = vl_model_dtype(o);
    if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
    if (o.lora) refuse_vision_targets(*o.lora);
    if (!o.adapter_dir.empty()) check_vl_adapter_excludes(o.adapter_dir);
    auto ckpt = safetensors::Checkpoint::open_dir(o.dir);
    auto model = std::make_unique<Qwen3VlModel>(cfg, ckpt, dtype, at::Device(o.device), o.kernels, o.weights);
    model->text().set_activation_checkpointing(o.activation_checkpointing);
    attach_vl_lora(model->text(), Qwen25VlModel::vl_lora_sites(cfg.text), v_.name, v_.name, o, dtype);
    log::info(str("loaded ", v_.name, " model from ", o.dir, " (", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size,
                  "; vision ", cfg.vision.depth, " blocks, hidden ", cfg.vision.hidden_size, ", deepstack ",
                  cfg.vision.deepstack_visual_indexes.size(), ")"));
    return model;
  }

  ModelCheck check(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override {
    Qwen3VlConfig cfg = v_.parse(hf_config, (fs::path(o.dir) / "config.json").string());
    const auto dtype = vl_model_dtype(o);
    auto ckpt = safetensors::Checkpoint::open_dir(o.dir);
    // What the model's load checks and resolves, in its order: the tower, then the language model.
    check_qwen3_vision_checkpoint(cfg.vision, vl_vision_view(ckpt), "visual.");
    const DecoderPlan text = plan_decoder(cfg.text, vl_text_view(ckpt), o.weights);
    if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
    ModelCheck out;
    out.family = v_.name;
    out.summary = str(v_.name, ": ", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size, "; vision ", cfg.vision.depth,
                      " blocks");
    out.ops = text.calls;
    // Every batch of this model carries multimodal [3, T] positions, and the fused norm_rope op takes 1-D
    // ones: the decoder runs the q/k norms as rms_norm calls (in the plan already) and rotates in ATen.
    std::erase_if(out.ops, [](const auto& c) { return c.op == "norm_rope"; });
    for (const auto& c : Qwen3VisionTower::calls()) out.ops.push_back(c);
    out.ops = ordered_calls(std::move(out.ops));
    out.quantize = text.quantize;
    if (o.lora) refuse_vision_targets(*o.lora);
    out.lora_modules = check_vl_lora(Qwen25VlModel::vl_lora_sites(cfg.text), v_.name, v_.name, o, dtype);
    return out;
  }

 private:
  Qwen3VlVariant v_;
};

}  // namespace

void register_qwen3_vl_variant(Registry& registry, const Qwen3VlVariant& variant) {
  Provider p;
  p.info.kind = ProviderKind::model;
  p.info.name = variant.name;
  p.info.summary = variant.summary;
  p.object = std::shared_ptr<ModelFamily>(std::make_shared<Qwen3VlFamily>(variant));
  registry.add(std::move(p));
}

void register_qwen3_vl(Registry& registry) {
  register_qwen3_vl_variant(registry, {"qwen3_vl", "Qwen3-VL (vision tower with learned positions + deepstack, qwen3 decoder "
                                       "with interleaved multimodal RoPE)", &parse_qwen3_vl_config});
}

}  // namespace ax::models
