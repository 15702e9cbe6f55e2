// Qwen2.5-VL: the rope index, the image-token splicing and the model family (models/qwen2_5_vl.hpp).
#include <algorithm>
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
#include "models/qwen2_5_vl.hpp"

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

// Checkpoint layouts: transformers 4 (and 5.23's save_pretrained) writes model.layers.*, model.embed_tokens.*,
// model.norm.*, lm_head.*, visual.*; transformers 5's module tree is model.language_model.*, model.visual.*.
safetensors::Checkpoint vl_text_view(const safetensors::Checkpoint& ckpt) {
  return ckpt.renamed([](const std::string& n) -> std::optional<std::string> {
    if (n.rfind("visual.", 0) == 0 || n.rfind("model.visual.", 0) == 0) return std::nullopt;
    if (n.rfind("model.language_model.", 0) == 0) return "model." + n.substr(21);
    return n;
  });
}
safetensors::Checkpoint vl_vision_view(const safetensors::Checkpoint& ckpt) {
  return ckpt.renamed([](const std::string& n) -> std::optional<std::string> {
    if (n.rfind("visual.", 0) == 0) return n;
    if (n.rfind("model.visual.", 0) == 0) return n.substr(6);
    return std::nullopt;
  });
}

std::vector<LoraSite> Qwen25VlModel::vl_lora_sites(const HfConfig& text) {
  std::vector<LoraSite> sites = models::lora_sites(text);
  for (auto& s : sites) s.peft_path = "model.language_model." + s.path.substr(6);  // "model." -> "model.language_model."
  return sites;
}

Qwen25VlModel::Qwen25VlModel(VlConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                             std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights)
    : cfg_(std::move(cfg)), device_(device) {
  safetensors::Checkpoint vis = vl_vision_view(ckpt);
  vision_ = std::make_unique<VisionTower>(cfg_.vision, vis, "visual.", dtype, device, kernels);
  std::set<std::string> used(vision_->used_keys().begin(), vision_->used_keys().end());
  for (const auto& n : vis.names())
    if (!used.count(n)) log::warn(str(vis.file_of(n), ": tensor '", n, "' is not used by the qwen2_5_vl vision tower"));
  text_ = std::make_unique<DecoderModel>(cfg_.text, vl_text_view(ckpt), dtype, device, std::move(kernels), weights);
}

ModelOutput Qwen25VlModel::forward(const Batch& batch, bool want_logits) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2) throw UsageError("model forward: input_ids must be [B, S]");
  const int64_t B = batch.input_ids.size(0), S = batch.input_ids.size(1), T = B * S;
  if (T == 0) throw UsageError("model forward: empty batch");
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
  // Spans whose positions restart at 0: the packed samples and the padding (cu_seqlens), else whole rows.
  at::Tensor cu = batch.cu_seqlens_host.defined() ? batch.cu_seqlens_host
                  : batch.cu_seqlens.defined()    ? batch.cu_seqlens.to(at::kCPU)
                                                  : at::arange(B + 1, at::kLong) * S;
  {
    at::Tensor c = cu.to(at::kLong);
    if (c.dim() != 1 || c.size(0) < 2 || c[0].item<int64_t>() != 0 || c[-1].item<int64_t>() != T ||
        (c.narrow(0, 1, c.size(0) - 1) < c.narrow(0, 0, c.size(0) - 1)).any().item<bool>())
      throw UsageError(str("model forward: cu_seqlens must rise from 0 to B*S = ", T));
  }
  at::Tensor ids_host = (batch.input_ids_host.defined() ? batch.input_ids_host : batch.input_ids).to(at::kCPU, at::kLong).reshape({T});
  {
    int64_t lo = ids_host.min().item<int64_t>(), hi = ids_host.max().item<int64_t>();
    if (lo < 0 || hi >= cfg_.text.vocab_size) throw UsageError(str("model forward: token ids must be in [0, ", cfg_.text.vocab_size, ")"));
  }
  at::Tensor rope_pos = to_device_async(mrope_positions(ids_host, cu, grids, cfg_), device_);
  at::Tensor ids = batch.input_ids.to(device_, at::kLong).reshape({T});
  at::Tensor embeds = text_->embed_tokens(ids);
  if (!grids.empty()) {
    at::Tensor feats = vision_->forward(pv->second, grids).to(embeds.scalar_type());  // [n_image_tokens, H]
    at::Tensor where = to_device_async(at::nonzero(ids_host.eq(cfg_.image_token_id)).squeeze(1), device_);
    // mrope_positions checked that the runs hold exactly the merged patches of every image, in order.
    embeds = embeds.index_put({where}, feats);
  }
  return text_->forward_embeds(batch, want_logits, embeds, rope_pos);
}

std::vector<std::pair<std::string, at::Tensor>> Qwen25VlModel::named_parameters() const {
  auto out = text_->named_parameters();
  for (const auto& p : vision_->weights()) out.push_back(p);
  return out;
}

CompositeLayout Qwen25VlModel::checkpoint_layout(const std::string& model_dir) const {
  const auto names = safetensors::Checkpoint::open_dir(model_dir).names();
  const bool nested = std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.rfind("model.language_model.", 0) == 0; });
  CompositeLayout l;
  l.text_name = [nested](const std::string& n) { return nested && n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n; };
  l.kept = [](const std::string& n) { return n.rfind("visual.", 0) == 0 || n.rfind("model.visual.", 0) == 0; };
  const std::string source = (fs::path(model_dir) / "config.json").string();
  l.tied = [source](const nlohmann::json& cfg) { return parse_qwen2_5_vl_config(cfg, source).text.tie_word_embeddings; };
  return l;
}

void Qwen25VlModel::save_adapter(const std::string& dir) const { save_vl_adapter(text_->lora(), dir); }

void save_vl_adapter(const LoraSet& lora, const std::string& dir) {
  if (lora.modules.empty()) throw UsageError("save_adapter: the model has no LoRA adapter");
  save_peft(lora, dir);
  // The target names (q_proj, gate_proj, ...) also name the vision tower's MLP in transformers' module tree:
  // peft is told to leave the tower alone, as it is here.
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  nlohmann::json j = read_json_file(path);
  j["exclude_modules"] = kVisionExclude;
  safetensors::write_file_atomic(path, j.dump(2) + "\n", "adapter");
}

void check_vl_adapter_excludes(const std::string& adapter_dir) {
  const std::string path = (fs::path(adapter_dir) / "adapter_config.json").string();
  nlohmann::json j = read_json_file(path);
  if (j.is_object() && j.contains("exclude_modules") && !j["exclude_modules"].is_null() && j["exclude_modules"] != kVisionExclude)
    throw UsageError(str(path, ": 'exclude_modules' ", j["exclude_modules"].dump(), " is not supported (only \"",
                         kVisionExclude, "\", the vision tower, which has no LoRA here anyway)"));
}

at::ScalarType vl_model_dtype(const ModelLoadOptions& o) {
  auto dtype = ops::parse_dtype(o.dtype);
  if (!dtype || *dtype == at::kDouble) throw UsageError(str("model dtype must be fp32, bf16 or fp16, got '", o.dtype, "'"));
  return *dtype;
}

namespace {

// An adapter's modules_to_save: the language model's base tensors sit under other names here
// (model.language_model.), and nothing maps them yet.
void refuse_vl_saved(const LoraSet& lora, const std::string& adapter_dir, const std::string& family) {
  if (!lora.saved.empty())
    throw UsageError(str(adapter_dir, ": modules_to_save (", join(lora.modules_to_save, ", "), ") is not supported for ", family));
}

}  // namespace

void attach_vl_lora(DecoderModel& text, const std::vector<LoraSite>& sites, const std::string& lora_family, const std::string& family,
                    const ModelLoadOptions& o, at::ScalarType dtype) {
  if (!o.lora && o.adapter_dir.empty()) return;
  at::Device device(o.device);
  LoraSet lora = o.lora ? make_lora(*o.lora, lora_family, sites, dtype, device) : load_peft(o.adapter_dir, lora_family, sites, dtype, device);
  refuse_vl_saved(lora, o.adapter_dir, family);
  fs::path base = fs::absolute(o.dir).lexically_normal();
  lora.base_model = (base.has_filename() ? base : base.parent_path()).string();
  text.set_lora(std::move(lora));
}

int64_t check_vl_lora(const std::vector<LoraSite>& sites, const std::string& lora_family, const std::string& family,
                      const ModelLoadOptions& o, at::ScalarType dtype) {
  if (o.lora) return static_cast<int64_t>(plan_lora(*o.lora, lora_family, sites).size());
  if (o.adapter_dir.empty()) return 0;
  check_vl_adapter_excludes(o.adapter_dir);
  const LoraSet adapter = load_peft(o.adapter_dir, lora_family, sites, dtype, at::kCPU);
  refuse_vl_saved(adapter, o.adapter_dir, family);
  return static_cast<int64_t>(adapter.modules.size());
}

namespace {

// LoRA targets that name a vision-tower module are refused: the tower is frozen (no LoRA sites).
void refuse_vision_targets(const LoraSpec& spec) {
  for (const auto& t : spec.targets)
    for (const char* v : {"visual", "qkv", "attn.proj", "patch_embed", "merger", "mlp.0", "mlp.2"})
      if (t == v || t.find(v) != std::string::npos)
        throw UsageError(str("lora: target '", t, "' names a module of the qwen2_5_vl vision tower, which is frozen (LoRA "
                             "applies to the language model only)"));
}

class Qwen25VlFamily : public ModelFamily, public ModelFamilyCheck {
 public:
  std::unique_ptr<Model> load(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override {
    VlConfig cfg = parse_qwen2_5_vl_config(hf_config, (fs::path(o.dir) / "config.json").string());
    auto dtype = vl_model_dtype(o);
    if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
    if (o.lora) refuse_vision_targets(*o.lora);
    if (!o.adapter_dir.empty()) check_vl_adapter_excludes(o.adapter_dir);
    at::Device device(o.device);
    auto ckpt = safetensors::Checkpoint::open_dir(o.dir);
    auto model = std::make_unique<Qwen25VlModel>(cfg, ckpt, dtype, device, o.kernels, o.weights);
    model->text().set_activation_checkpointing(o.activation_checkpointing);
    attach_vl_lora(model->text(), model->lora_sites(), "qwen2", "qwen2_5_vl", o, dtype);
    log::info(str("loaded qwen2_5_vl model from ", o.dir, " (", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size,
                  "; vision ", cfg.vision.depth, " blocks, hidden ", cfg.vision.hidden_size, ")"));
    return model;
  }

  ModelCheck check(const nlohmann::json& hf_config, const ModelLoadOptions& o) const override {
    VlConfig cfg = parse_qwen2_5_vl_config(hf_config, (fs::path(o.dir) / "config.json").string());
    auto dtype = vl_model_dtype(o);
    auto ckpt = safetensors::Checkpoint::open_dir(o.dir);
    // What the model's load checks and resolves, in its order: the tower, then the language model.
    check_vision_checkpoint(cfg.vision, vl_vision_view(ckpt), "visual.");
    const DecoderPlan text = plan_decoder(cfg.text, vl_text_view(ckpt), o.weights);
    if (o.lora && !o.adapter_dir.empty()) throw UsageError("give either a new LoRA spec or an adapter dir, not both");
    ModelCheck out;
    out.family = "qwen2_5_vl";
    out.summary = str("qwen2_5_vl: ", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size, "; vision ", cfg.vision.depth,
                      " blocks");
    out.ops = text.calls;
    for (const auto& c : VisionTower::calls()) out.ops.push_back(c);
    out.ops = ordered_calls(std::move(out.ops));
    out.quantize = text.quantize;
    if (o.lora) refuse_vision_targets(*o.lora);
    out.lora_modules = check_vl_lora(Qwen25VlModel::vl_lora_sites(cfg.text), "qwen2", "qwen2_5_vl", o, dtype);
    return out;
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
