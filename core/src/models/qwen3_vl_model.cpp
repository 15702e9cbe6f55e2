// Qwen3-VL: the model (image splicing, deepstack) and its family (models/qwen3_vl.hpp). The rope index is
// qwen2_5_vl's (transformers' two get_rope_index agree on images); the checkpoint views and LoRA sites too.
#include <filesystem>

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
#include "ops/check.hpp"

namespace ax::models {
namespace fs = std::filesystem;

namespace {

VlInspect inspect(const nlohmann::json& cfg, const std::string& source) {
  return qwen3_vl_inspect(parse_qwen3_vl_config(cfg, source), "qwen3_vl (language model qwen3)");
}

}  // namespace

VlInspect qwen3_vl_inspect(const Qwen3VlConfig& vl, const std::string& architecture) {
  const auto& v = vl.vision;
  VlInspect out{vl.text, architecture,
                str(v.depth, " blocks, hidden ", v.hidden_size, ", heads ", v.num_heads, ", patch ", v.patch_size, " (temporal ",
                    v.temporal_patch_size, ", merge ", v.spatial_merge_size, "), ", v.num_position_embeddings,
                    " learned positions, deepstack blocks ", ops::check::shape_str(v.deepstack_visual_indexes), "; mrope_section ",
                    ops::check::shape_str(vl.mrope_section), " interleaved"),
                {}, {}};
  for (const auto& [n, s] : qwen3_vision_tensors(v)) {
    out.vision.emplace_back("visual." + n, s);
    // Its linear layers (the LoRA sites): the blocks' qkv, proj, linear_fc1/2 and the mergers' linear_fc1/2 — every
    // [out, in] weight but the learned position table's.
    if (s.size() == 2 && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 && n != "pos_embed.weight")
      out.linears.push_back("visual." + n.substr(0, n.size() - 7));
  }
  VisionConfig depth;  // check_vision_blocks reads the depth only
  depth.depth = v.depth;
  out.check_sizes = [depth](const safetensors::Checkpoint& vis) { check_vision_blocks(depth, vis, "visual."); };
  return out;
}

// The checkpoint layouts are qwen2_5_vl's (visual.* / model.visual.*, model.* / model.language_model.*).
const VlDescription& qwen3_vl_description() {
  static const VlDescription d{"qwen3_vl", "qwen3", kVisionExclude, "vision tower",
                               // the language model's projections (q_proj ... down_proj) share no name with the tower
                               {"visual", "qkv", "attn.proj", "patch_embed", "pos_embed", "merger", "linear_fc1", "linear_fc2"},
                               qwen2_5_vl_description().text_name, qwen2_5_vl_description().vision_name, inspect,
                               "tiny-qwen3-vl", init_qwen3_vl_dir, "qwen2_vl"};  // Qwen2.5-VL's processor, its own config (patch 16)
  return d;
}

Qwen3VlModel::Qwen3VlModel(const VlDescription& desc, Qwen3VlConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype,
                           at::Device device, std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights)
    : VlModel(desc, device), cfg_(std::move(cfg)) {
  safetensors::Checkpoint vis = vl_vision_view(desc_, ckpt);
  vision_ = std::make_unique<Qwen3VisionTower>(cfg_.vision, vis, "visual.", dtype, device, kernels);
  vision_lora_ = VisionLora(dtype, kernels);
  vision_->set_lora(&vision_lora_);
  warn_unused(vis, vision_->used_keys());
  load_text(cfg_.text, ckpt, dtype, std::move(kernels), weights);
}

std::string Qwen3VlModel::vision_summary() const {
  return str("vision ", cfg_.vision.depth, " blocks, hidden ", cfg_.vision.hidden_size, ", deepstack ",
             cfg_.vision.deepstack_visual_indexes.size());
}

ModelOutput Qwen3VlModel::forward(const Batch& batch, bool want_logits) {
  const Tokens t = tokens(batch);
  auto pv = batch.extras.find("pixel_values");
  auto gt = batch.extras.find("image_grid_thw");
  if ((pv == batch.extras.end()) != (gt == batch.extras.end()))
    throw UsageError("qwen3_vl: a batch needs both extras \"pixel_values\" and \"image_grid_thw\", or neither");
  // As qwen2_5_vl: the rope index and the splice positions come from the host copies Batch::to keeps.
  auto grid_host = batch.extras_host.find("image_grid_thw");
  Grids grids;
  if (gt != batch.extras.end())
    grids = read_grids(grid_host != batch.extras_host.end() ? grid_host->second : gt->second, cfg_.vision.spatial_merge_size, "qwen3_vl");
  at::Tensor rope_pos = to_device_async(mrope_positions(t.ids_host, t.cu, grids, cfg_.rope_tokens()), device_);
  at::Tensor embeds = text_->embed_tokens(t.ids);
  if (grids.empty()) return text_->forward_embeds(batch, want_logits, embeds, rope_pos);
  Qwen3VisionTower::Features feats = vision_->forward(pv->second, grids);
  // mrope_positions checked that the runs hold exactly the merged patches of every image, in order.
  at::Tensor where = to_device_async(at::nonzero(t.ids_host.eq(cfg_.image_token_id)).squeeze(1), device_);
  embeds = embeds.index_put({where}, feats.merged.to(embeds.scalar_type()));
  // Deepstack (Qwen3VLTextModel._deepstack_process): feature k is added to the image tokens' hidden states
  // after decoder layer k.
  auto deepstack = [&](int64_t layer, const at::Tensor& h) {
    if (layer >= static_cast<int64_t>(feats.deepstack.size())) return h;
    return h.index_add(0, where, feats.deepstack[layer].to(h.scalar_type()));
  };
  return text_->forward_embeds(batch, want_logits, embeds, rope_pos, deepstack);
}

namespace {

// One class for the variants (qwen3_vl, qwen3_vl_moe): they differ in the decoder their config parser builds and
// in their description (the LoRA family: peft converts no expert target of qwen3_vl_moe, models/qwen3_vl_moe.cpp).
class Qwen3VlFamily : public VlFamily {
 public:
  explicit Qwen3VlFamily(const Qwen3VlVariant& v) : VlFamily(v.description()), parse_(v.parse) {}

 protected:
  std::unique_ptr<VlModel> build(const nlohmann::json& hf_config, const ModelLoadOptions& o, const safetensors::Checkpoint& ckpt,
                                 at::ScalarType dtype) const override {
    Qwen3VlConfig cfg = parse_(hf_config, (fs::path(o.dir) / "config.json").string());
    return std::make_unique<Qwen3VlModel>(desc_, std::move(cfg), ckpt, dtype, at::Device(o.device), o.kernels, o.weights);
  }

  Plan plan(const nlohmann::json& hf_config, const std::string& source, const safetensors::Checkpoint& ckpt) const override {
    Qwen3VlConfig cfg = parse_(hf_config, source);
    check_qwen3_vision_checkpoint(cfg.vision, vl_vision_view(desc_, ckpt), "visual.");
    // Every batch of this model carries multimodal [3, T] positions, and the fused norm_rope op takes 1-D
    // ones: the decoder runs the q/k norms as rms_norm calls (in the plan already) and rotates in ATen.
    return {cfg.text,
            str(desc_.family, ": ", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size, "; vision ", cfg.vision.depth,
                " blocks"),
            Qwen3VisionTower::calls(), {"norm_rope"}};
  }

 private:
  Qwen3VlConfig (*parse_)(const nlohmann::json& j, const std::string& source);
};

}  // namespace

void register_qwen3_vl_variant(Registry& registry, const Qwen3VlVariant& variant) {
  Provider p;
  p.info.kind = ProviderKind::model;
  p.info.name = variant.description().family;
  p.info.summary = variant.summary;
  p.object = std::shared_ptr<ModelFamily>(std::make_shared<Qwen3VlFamily>(variant));
  registry.add(std::move(p));
}

void register_qwen3_vl(Registry& registry) {
  register_qwen3_vl_variant(registry, {&qwen3_vl_description, "Qwen3-VL (vision tower with learned positions + deepstack, qwen3 decoder "
                                       "with interleaved multimodal RoPE)", &parse_qwen3_vl_config});
}

}  // namespace ax::models
