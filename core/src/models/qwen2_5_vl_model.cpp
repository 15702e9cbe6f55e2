// Qwen2.5-VL: the rope index, the image-token splicing and the model family (models/qwen2_5_vl.hpp).
#include <algorithm>
#include <filesystem>
#include <optional>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/model_check.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/strings.hpp"
#include "models/decoder_plan.hpp"
#include "models/lora.hpp"
#include "models/qwen2_5_vl.hpp"
#include "ops/check.hpp"

namespace ax::models {
namespace fs = std::filesystem;

at::Tensor mrope_positions(const at::Tensor& ids, const at::Tensor& cu, const Grids& grids, const VlConfig& cfg) {
  return mrope_positions(ids, cu, grids, MropeTokens{cfg.vision.spatial_merge_size, cfg.image_token_id, cfg.video_token_id, "qwen2_5_vl"});
}

at::Tensor mrope_positions(const at::Tensor& ids_in, const at::Tensor& cu_in, const Grids& grids, const MropeTokens& cfg) {
  at::Tensor ids = ids_in.to(at::kCPU, at::kLong).contiguous(), cu = cu_in.to(at::kCPU, at::kLong).contiguous();
  const int64_t T = ids.size(0), n_spans = cu.size(0) - 1, m = cfg.merge;
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* c = cu.data_ptr<int64_t>();
  at::Tensor out = at::empty({3, T}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  std::size_t next = 0;  // the next image's grid
  for (int64_t s = 0; s < n_spans; ++s) {
    int64_t cur = 0;
    for (int64_t k = c[s]; k < c[s + 1];) {
      if (id[k] == cfg.video_token_id)
        throw UsageError(str(cfg.family, ": token ", k, " is the video token (", cfg.video_token_id, "); videos are not supported"));
      if (id[k] != cfg.image_token_id) {
        p[k] = p[T + k] = p[2 * T + k] = cur++;
        ++k;
        continue;
      }
      int64_t e = k;
      while (e < c[s + 1] && id[e] == cfg.image_token_id) ++e;
      if (next >= grids.size())
        throw UsageError(str(cfg.family, ": the batch holds more image placeholder runs than image_grid_thw has images (",
                             grids.size(), ")"));
      const auto [t, h, w] = grids[next];
      const int64_t lh = h / m, lw = w / m;
      if (e - k != t * lh * lw)
        throw UsageError(str(cfg.family, ": image ", next, " (grid_thw [", t, ", ", h, ", ", w, "]) needs ", t * lh * lw,
                             " placeholder tokens but its run at token ", k, " has ", e - k,
                             " (a sample cut inside an image, or images without text between them?)"));
      for (int64_t f = 0, q = k; f < t; ++f)
        for (int64_t y = 0; y < lh; ++y)
          for (int64_t x = 0; x < lw; ++x, ++q) {
            p[q] = cur + f;
            p[T + q] = cur + y;
            p[2 * T + q] = cur + x;
          }
      cur += std::max(h, w) / m;
      ++next;
      k = e;
    }
  }
  if (next != grids.size())
    throw UsageError(str(cfg.family, ": image_grid_thw has ", grids.size(), " images but the tokens hold ", next, " placeholder runs"));
  return out;
}

namespace {

// Checkpoint layouts: transformers 4 (and 5.23's save_pretrained) writes model.layers.*, model.embed_tokens.*,
// model.norm.*, lm_head.*, visual.*; transformers 5's module tree is model.language_model.*, model.visual.*.
std::optional<std::string> text_name(const std::string& n) {
  if (n.rfind("visual.", 0) == 0 || n.rfind("model.visual.", 0) == 0) return std::nullopt;
  if (n.rfind("model.language_model.", 0) == 0) return "model." + n.substr(21);
  return n;
}
std::optional<std::string> vision_name(const std::string& n) {
  if (n.rfind("visual.", 0) == 0) return n;
  if (n.rfind("model.visual.", 0) == 0) return n.substr(6);
  return std::nullopt;
}

VlInspect inspect(const nlohmann::json& cfg, const std::string& source) {
  const VlConfig vl = parse_qwen2_5_vl_config(cfg, source);
  const auto& v = vl.vision;
  VlInspect out{vl.text, "qwen2_5_vl (language model qwen2)",
                str(v.depth, " blocks, hidden ", v.hidden_size, ", heads ", v.num_heads, ", patch ", v.patch_size, " (temporal ",
                    v.temporal_patch_size, ", merge ", v.spatial_merge_size, "), window ", v.window_size, "; mrope_section ",
                    ops::check::shape_str(vl.text.mrope_section)),
                {}, {}};
  for (const auto& [n, s] : vision_checkpoint_tensors(v)) out.vision.emplace_back("visual." + n, s);
  out.check_sizes = [v](const safetensors::Checkpoint& vis) { check_vision_blocks(v, vis, "visual."); };
  return out;
}

}  // namespace

const VlDescription& qwen2_5_vl_description() {
  static const VlDescription d{"qwen2_5_vl", "qwen2", ".*visual.*", "vision tower",
                               // the tower's modules; its MLP's gate_proj / up_proj / down_proj share the language model's names
                               {"visual", "qkv", "attn.proj", "patch_embed", "merger", "mlp.0", "mlp.2"},
                               text_name, vision_name, inspect, "tiny-qwen2_5-vl", init_qwen2_5_vl_dir, "qwen2_vl"};
  return d;
}

Qwen25VlModel::Qwen25VlModel(VlConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                             std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights)
    : VlModel(qwen2_5_vl_description(), device), cfg_(std::move(cfg)) {
  safetensors::Checkpoint vis = vl_vision_view(desc_, ckpt);
  vision_ = std::make_unique<VisionTower>(cfg_.vision, vis, "visual.", dtype, device, kernels);
  warn_unused(vis, vision_->used_keys());
  load_text(cfg_.text, ckpt, dtype, std::move(kernels), weights);
}

std::string Qwen25VlModel::vision_summary() const {
  return str("vision ", cfg_.vision.depth, " blocks, hidden ", cfg_.vision.hidden_size);
}

ModelOutput Qwen25VlModel::forward(const Batch& batch, bool want_logits) {
  const Tokens t = tokens(batch);
  auto pv = batch.extras.find("pixel_values");
  auto gt = batch.extras.find("image_grid_thw");
  if ((pv == batch.extras.end()) != (gt == batch.extras.end()))
    throw UsageError("qwen2_5_vl: a batch needs both extras \"pixel_values\" and \"image_grid_thw\", or neither");
  // The rope index, the splice positions and the vision tower's window tables are built on the host from
  // input_ids, cu_seqlens and image_grid_thw: Batch::to keeps their host copies, so a device batch is not
  // read back (a host sync per forward); a batch made on the device is read back, once.
  auto grid_host = batch.extras_host.find("image_grid_thw");
  Grids grids;
  if (gt != batch.extras.end()) grids = read_grids(grid_host != batch.extras_host.end() ? grid_host->second : gt->second, cfg_.vision);
  at::Tensor rope_pos = to_device_async(mrope_positions(t.ids_host, t.cu, grids, cfg_), device_);
  at::Tensor embeds = text_->embed_tokens(t.ids);
  if (!grids.empty()) {
    at::Tensor feats = vision_->forward(pv->second, grids).to(embeds.scalar_type());  // [n_image_tokens, H]
    at::Tensor where = to_device_async(at::nonzero(t.ids_host.eq(cfg_.image_token_id)).squeeze(1), device_);
    // mrope_positions checked that the runs hold exactly the merged patches of every image, in order.
    embeds = embeds.index_put({where}, feats);
  }
  return text_->forward_embeds(batch, want_logits, embeds, rope_pos);
}

namespace {

class Qwen25VlFamily : public VlFamily {
 public:
  Qwen25VlFamily() : VlFamily(qwen2_5_vl_description()) {}

 protected:
  std::unique_ptr<VlModel> build(const nlohmann::json& hf_config, const ModelLoadOptions& o, const safetensors::Checkpoint& ckpt,
                                 at::ScalarType dtype) const override {
    VlConfig cfg = parse_qwen2_5_vl_config(hf_config, (fs::path(o.dir) / "config.json").string());
    return std::make_unique<Qwen25VlModel>(std::move(cfg), ckpt, dtype, at::Device(o.device), o.kernels, o.weights);
  }

  Plan plan(const nlohmann::json& hf_config, const std::string& source, const safetensors::Checkpoint& ckpt) const override {
    VlConfig cfg = parse_qwen2_5_vl_config(hf_config, source);
    check_vision_checkpoint(cfg.vision, vl_vision_view(desc_, ckpt), "visual.");
    return {cfg.text, str("qwen2_5_vl: ", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size, "; vision ", cfg.vision.depth, " blocks"),
            VisionTower::calls(), {}};
  }
};

}  // namespace

void register_qwen2_5_vl(Registry& registry) {
  Provider p;
  p.info.kind = ProviderKind::model;
  p.info.name = "qwen2_5_vl";
  p.info.summary = "Qwen2.5-VL (vision tower with window attention + 2x2 merger, qwen2 decoder with multimodal RoPE)";
  p.object = std::shared_ptr<ModelFamily>(std::make_shared<Qwen25VlFamily>());
  registry.add(std::move(p));
}

}  // namespace ax::models
