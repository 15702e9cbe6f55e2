// Gemma 3 multimodal: config, SigLIP tower + projector, image splicing with bidirectional image groups, the
// family (models/gemma3_mm.hpp).
#include "models/gemma3_mm.hpp"

#include <cmath>
#include <filesystem>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/model_check.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/decoder_plan.hpp"
#include "models/autograd_ops.hpp"
#include "models/lora.hpp"
#include "ops/check.hpp"

namespace ax::models {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

int64_t gemma3_positive(const json& o, const std::string& where, const std::string& k, int64_t def, const std::string& source) {
  if (!o.contains(k) || o[k].is_null()) return def;
  if (!o[k].is_number_integer() || o[k].get<int64_t>() <= 0 || o[k].get<int64_t>() > (int64_t(1) << 24))
    throw UsageError(str(source, ": '", where, k, "' must be a positive integer, got ", o[k].dump()));
  return o[k].get<int64_t>();
}

SiglipConfig parse_siglip(const json& v, const std::string& source) {
  if (!v.is_object()) throw UsageError(str(source, ": 'vision_config' must be an object"));
  const std::string w = "vision_config.";
  if (v.contains("model_type") && !v["model_type"].is_null() && v["model_type"] != "siglip_vision_model")
    throw UsageError(str(source, ": '", w, "model_type' must be \"siglip_vision_model\", got ", v["model_type"].dump()));
  SiglipConfig s;
  s.hidden_size = gemma3_positive(v, w, "hidden_size", s.hidden_size, source);
  s.intermediate_size = gemma3_positive(v, w, "intermediate_size", s.intermediate_size, source);
  s.num_layers = gemma3_positive(v, w, "num_hidden_layers", s.num_layers, source);
  s.num_heads = gemma3_positive(v, w, "num_attention_heads", s.num_heads, source);
  s.num_channels = gemma3_positive(v, w, "num_channels", s.num_channels, source);
  s.image_size = gemma3_positive(v, w, "image_size", s.image_size, source);  // a list ([h, w]) is refused here
  s.patch_size = gemma3_positive(v, w, "patch_size", s.patch_size, source);
  if (v.contains("layer_norm_eps") && !v["layer_norm_eps"].is_null()) {
    if (!v["layer_norm_eps"].is_number() || !(v["layer_norm_eps"].get<double>() > 0))
      throw UsageError(str(source, ": '", w, "layer_norm_eps' must be a number > 0, got ", v["layer_norm_eps"].dump()));
    s.layer_norm_eps = v["layer_norm_eps"].get<double>();
  }
  if (v.contains("hidden_act") && !v["hidden_act"].is_null() && v["hidden_act"] != "gelu_pytorch_tanh")
    throw UsageError(str(source, ": '", w, "hidden_act' ", v["hidden_act"].dump(), " is not supported (only gelu_pytorch_tanh)"));
  if (s.hidden_size % s.num_heads != 0)
    throw UsageError(str(source, ": '", w, "hidden_size' ", s.hidden_size, " is not a multiple of num_attention_heads ", s.num_heads));
  if (s.image_size % s.patch_size != 0)
    throw UsageError(str(source, ": '", w, "image_size' ", s.image_size, " is not a multiple of patch_size ", s.patch_size));
  return s;
}

}  // namespace

int64_t Gemma3MmConfig::tokens_per_side() const { return static_cast<int64_t>(std::llround(std::sqrt(double(mm_tokens_per_image)))); }

Gemma3MmConfig parse_gemma3_mm_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw UsageError(str(source, ": not a JSON object"));
  if (j.value("model_type", "") != "gemma3")
    throw UsageError(str(source, ": 'model_type' must be \"gemma3\", got ", j.value("model_type", json()).dump()));
  Gemma3MmConfig c;
  c.vision = parse_siglip(j.contains("vision_config") && !j["vision_config"].is_null() ? j["vision_config"] : json::object(), source);
  c.mm_tokens_per_image = gemma3_positive(j, "", "mm_tokens_per_image", c.mm_tokens_per_image, source);
  // Gemma3Config's attribute_map: image_token_id is image_token_index, and so on.
  auto token = [&](const char* index_key, const char* id_key, int64_t def) {
    for (const char* k : {index_key, id_key})
      if (j.contains(k) && !j[k].is_null()) {
        if (!j[k].is_number_integer() || j[k].get<int64_t>() < 0) throw UsageError(str(source, ": '", k, "' must be a token id, got ", j[k].dump()));
        return j[k].get<int64_t>();
      }
    return def;
  };
  c.image_token_id = token("image_token_index", "image_token_id", c.image_token_id);
  c.boi_token_id = token("boi_token_index", "boi_token_id", c.boi_token_id);
  c.eoi_token_id = token("eoi_token_index", "eoi_token_id", c.eoi_token_id);
  const int64_t side = c.tokens_per_side(), patches = c.vision.patches_per_side();
  if (side * side != c.mm_tokens_per_image)
    throw UsageError(str(source, ": 'mm_tokens_per_image' ", c.mm_tokens_per_image, " is not a square (the projector pools to a square grid)"));
  if (patches % side != 0)
    throw UsageError(str(source, ": the vision tower's ", patches, " x ", patches, " patches (image_size / patch_size) do not pool evenly to ",
                         side, " x ", side, " tokens (mm_tokens_per_image ", c.mm_tokens_per_image, ")"));

  // The language model: a gemma3_text decoder read by its family, with Gemma3TextConfig's defaults.
  json t = j.contains("text_config") && !j["text_config"].is_null() ? j["text_config"] : json::object();
  if (!t.is_object()) throw UsageError(str(source, ": 'text_config' must be an object"));
  t["model_type"] = "gemma3_text";
  // Gemma3Config's tie_word_embeddings (default true) decides, as the peer's _tied_weights_keys do.
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_null()) {
    if (!j["tie_word_embeddings"].is_boolean()) throw UsageError(str(source, ": 'tie_word_embeddings' must be true or false"));
    t["tie_word_embeddings"] = j["tie_word_embeddings"];
  }
  c.text = parse_hf_config(t, source + " (text_config)");
  for (auto [name, id] : {std::pair<const char*, int64_t>{"image_token_index", c.image_token_id}, {"boi_token_index", c.boi_token_id},
                          {"eoi_token_index", c.eoi_token_id}})
    if (id >= c.text.vocab_size)
      throw UsageError(str(source, ": '", name, "' ", id, " is not below text_config.vocab_size ", c.text.vocab_size));
  return c;
}

namespace {

std::optional<std::string> text_name(const std::string& n) {
  for (const char* p : {"language_model.model.", "model.language_model."})
    if (n.rfind(p, 0) == 0) return "model." + n.substr(std::string(p).size());
  if (n == "language_model.lm_head.weight" || n == "lm_head.weight") return std::string("lm_head.weight");
  return std::nullopt;
}

std::optional<std::string> vision_name(const std::string& n) {
  for (const char* p : {"model.vision_tower.vision_model.", "vision_tower.vision_model.", "model.vision_tower.", "vision_tower."})
    if (n.rfind(p, 0) == 0) return "vision_tower." + n.substr(std::string(p).size());
  for (const char* p : {"model.multi_modal_projector.", "multi_modal_projector."})
    if (n.rfind(p, 0) == 0) return "multi_modal_projector." + n.substr(std::string(p).size());
  return std::nullopt;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> gemma3_vision_tensors(const Gemma3MmConfig& c) {
  const SiglipConfig& v = c.vision;
  const int64_t C = v.hidden_size, I = v.intermediate_size, P = v.patch_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out{
      {"vision_tower.embeddings.patch_embedding.weight", {C, v.num_channels, P, P}},
      {"vision_tower.embeddings.patch_embedding.bias", {C}},
      {"vision_tower.embeddings.position_embedding.weight", {v.patches_per_side() * v.patches_per_side(), C}}};
  for (int64_t i = 0; i < v.num_layers; ++i) {
    const std::string p = str("vision_tower.encoder.layers.", i, ".");
    for (const char* ln : {"layer_norm1", "layer_norm2"}) {
      out.push_back({p + ln + ".weight", {C}});
      out.push_back({p + ln + ".bias", {C}});
    }
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      out.push_back({p + "self_attn." + proj + ".weight", {C, C}});
      out.push_back({p + "self_attn." + proj + ".bias", {C}});
    }
    out.push_back({p + "mlp.fc1.weight", {I, C}});
    out.push_back({p + "mlp.fc1.bias", {I}});
    out.push_back({p + "mlp.fc2.weight", {C, I}});
    out.push_back({p + "mlp.fc2.bias", {C}});
  }
  out.push_back({"vision_tower.post_layernorm.weight", {C}});
  out.push_back({"vision_tower.post_layernorm.bias", {C}});
  out.push_back({"multi_modal_projector.mm_soft_emb_norm.weight", {C}});
  out.push_back({"multi_modal_projector.mm_input_projection_weight", {C, c.text.hidden_size}});
  return out;
}

std::vector<std::string> gemma3_vision_linears(const Gemma3MmConfig& c) {
  // The tower's q/k/v/out_proj, fc1, fc2: every [out, in] weight but the position table's. The projector's
  // mm_input_projection_weight is a bare parameter (a matmul, not an nn.Linear): peft has no LoRA module for it.
  std::vector<std::string> out;
  for (const auto& [name, shape] : gemma3_vision_tensors(c))
    if (shape.size() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 && name.find("position_embedding") == std::string::npos)
      out.push_back(name.substr(0, name.size() - 7));
  return out;
}

at::Tensor image_groups(const at::Tensor& ids_in, const at::Tensor& cu_in, int64_t image_token_id) {
  at::Tensor ids = ids_in.to(at::kCPU, at::kLong).contiguous(), cu = cu_in.to(at::kCPU, at::kLong).contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* c = cu.data_ptr<int64_t>();
  at::Tensor out = at::full({ids.size(0)}, -1, at::kInt);
  int32_t* g = out.data_ptr<int32_t>();
  int32_t next = 0;
  for (int64_t s = 0; s + 1 < cu.size(0); ++s)
    for (int64_t k = c[s]; k < c[s + 1]; ++k)
      if (id[k] == image_token_id) g[k] = k > c[s] && id[k - 1] == image_token_id ? g[k - 1] : next++;
  return out;
}

Gemma3Vision::Gemma3Vision(const Gemma3MmConfig& cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                           std::shared_ptr<KernelSet> kernels)
    : cfg_(cfg), dtype_(dtype), device_(device), kernels_(std::move(kernels)) {
  for (const auto& [name, shape] : gemma3_vision_tensors(cfg_)) {
    const auto& info = ckpt.info(name);  // throws naming the checkpoint and tensor
    if (info.shape != shape)
      throw UsageError(str(ckpt.file_of(name), ": tensor '", name, "' has shape ", ops::check::shape_str(info.shape), " but the config implies ", ops::check::shape_str(shape)));
    if (!at::isFloatingType(info.scalar_type)) throw UsageError(str(ckpt.file_of(name), ": tensor '", name, "' has non-float dtype ", info.dtype));
    at::Tensor t = ckpt.get(name).to(device_, dtype_);
    used_.push_back(name);
    named_.emplace_back(name, t);
    weights_[name] = t;
  }
}

const at::Tensor& Gemma3Vision::w(const std::string& name) const {
  auto it = weights_.find(name);
  if (it == weights_.end()) throw RuntimeError(str("gemma3 vision tower has no weight '", name, "'"));
  return it->second;
}

at::Tensor Gemma3Vision::linear(const at::Tensor& x, const std::string& module) const {
  if (lora_) return lora_->linear(x, w(module + ".weight"), w(module + ".bias"), module);
  return at::linear(x, w(module + ".weight"), w(module + ".bias"));
}

at::Tensor Gemma3Vision::layer_norm(const at::Tensor& x, const std::string& module) const {
  return at::layer_norm(x, {cfg_.vision.hidden_size}, w(module + ".weight"), w(module + ".bias"), cfg_.vision.layer_norm_eps);
}

// SiglipEncoderLayer: pre-LayerNorm attention (every patch of an image sees every other) and MLP (fc1, GELU-tanh, fc2).
at::Tensor Gemma3Vision::layer(int64_t i, const at::Tensor& x, const at::Tensor& cu) const {
  const std::string p = str("vision_tower.encoder.layers.", i, ".");
  const int64_t N = x.size(0), H = cfg_.vision.num_heads, D = cfg_.vision.head_dim();
  at::Tensor n = layer_norm(x, p + "layer_norm1");
  ops::AttentionArgs a;
  a.q = linear(n, p + "self_attn.q_proj").view({N, H, D});
  a.k = linear(n, p + "self_attn.k_proj").view({N, H, D});
  a.v = linear(n, p + "self_attn.v_proj").view({N, H, D});
  a.cu_seqlens = cu;
  a.max_seqlen = cfg_.vision.patches_per_side() * cfg_.vision.patches_per_side();
  a.softmax_scale = 1.0 / std::sqrt(double(D));
  a.causal = false;
  a.check_values = false;  // built here
  if (!attention_) attention_ = attention_chain_of(*kernels_, dtype_, "");
  // Through the autograd adapter: with LoRA on the tower the gradient reaches q / k / v's factors.
  at::Tensor h = x + linear(autograd::attention(attention_, std::move(a)).reshape({N, H * D}), p + "self_attn.out_proj");
  return h + linear(at::gelu(linear(layer_norm(h, p + "layer_norm2"), p + "mlp.fc1"), "tanh"), p + "mlp.fc2");
}

at::Tensor Gemma3Vision::forward(const at::Tensor& pixel_values) const {
  std::optional<at::NoGradGuard> no_grad;  // frozen: no graph is kept
  if (!lora_ || lora_->empty()) no_grad.emplace();
  const SiglipConfig& v = cfg_.vision;
  const int64_t S = v.image_size, side = v.patches_per_side(), P = side * side, C = v.hidden_size;
  if (pixel_values.dim() != 4 || pixel_values.size(1) != v.num_channels || pixel_values.size(2) != S || pixel_values.size(3) != S)
    throw UsageError(str("gemma3: extras[\"pixel_values\"] is ", ops::check::shape_str(pixel_values.sizes().vec()), " but the vision tower takes [n_images, ",
                         v.num_channels, ", ", S, ", ", S, "]"));
  if (!at::isFloatingType(pixel_values.scalar_type())) throw UsageError("gemma3: extras[\"pixel_values\"] must be a float tensor");
  const int64_t N = pixel_values.size(0);
  // SiglipVisionEmbeddings: the patch Conv2d (stride = kernel), flattened row-major, plus learned positions.
  at::Tensor x = at::conv2d(pixel_values.to(device_, dtype_), w("vision_tower.embeddings.patch_embedding.weight"),
                            w("vision_tower.embeddings.patch_embedding.bias"), {v.patch_size, v.patch_size});
  x = x.flatten(2).transpose(1, 2) + w("vision_tower.embeddings.position_embedding.weight").unsqueeze(0);  // [N, P, C]
  x = x.reshape({N * P, C});
  at::Tensor cu = at::arange(0, (N + 1) * P, P, at::TensorOptions().dtype(at::kInt).device(device_));  // one span per image
  for (int64_t i = 0; i < v.num_layers; ++i) x = layer(i, x, cu);
  x = layer_norm(x, "vision_tower.post_layernorm");
  // Gemma3MultiModalProjector: average pooling of the patch grid to tokens_per_side², a (1 + w) RMSNorm in fp32,
  // then the projection; the result in the tower's dtype.
  const int64_t k = side / cfg_.tokens_per_side();
  at::Tensor grid = x.view({N, P, C}).transpose(1, 2).reshape({N, C, side, side});
  at::Tensor pooled = at::avg_pool2d(grid, {k, k}, {k, k}).flatten(2).transpose(1, 2);  // [N, mm, C]
  at::Tensor f = pooled.to(at::kFloat);
  f = f * at::rsqrt(f.pow(2).mean(-1, true) + v.layer_norm_eps) * (1.0 + w("multi_modal_projector.mm_soft_emb_norm.weight").to(at::kFloat));
  at::Tensor normed = f.to(pooled.scalar_type());
  return at::matmul(normed, w("multi_modal_projector.mm_input_projection_weight")).reshape({N * cfg_.mm_tokens_per_image, -1});
}

namespace {

VlInspect inspect(const json& cfg, const std::string& source) {
  const Gemma3MmConfig g = parse_gemma3_mm_config(cfg, source);
  return {g.text, "gemma3 (language model gemma3_text)",
          str("SigLIP, ", g.vision.num_layers, " layers, hidden ", g.vision.hidden_size, ", heads ", g.vision.num_heads, ", image ",
              g.vision.image_size, " / patch ", g.vision.patch_size, "; ", g.mm_tokens_per_image, " tokens per image"),
          gemma3_vision_tensors(g), {}, gemma3_vision_linears(g)};
}

}  // namespace

const VlDescription& gemma3_mm_description() {
  static const VlDescription d{"gemma3", "gemma3_text", kSiglipExclude, "vision tower or projector",
                               // the SigLIP tower's q_proj / k_proj / v_proj share the language model's names
                               {"vision_tower", "multi_modal_projector", "out_proj", "fc1", "fc2", "patch_embedding"},
                               text_name, vision_name, inspect, "tiny-gemma3-mm", init_gemma3_mm_dir, "gemma3"};
  return d;
}

Gemma3MmModel::Gemma3MmModel(Gemma3MmConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                             std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights)
    : VlModel(gemma3_mm_description(), device), cfg_(std::move(cfg)) {
  safetensors::Checkpoint vis = vl_vision_view(desc_, ckpt);
  vision_ = std::make_unique<Gemma3Vision>(cfg_, vis, dtype, device, kernels);
  vision_lora_ = VisionLora(dtype, kernels);
  vision_->set_lora(&vision_lora_);
  warn_unused(vis, vision_->used_keys());  // e.g. a SigLIP pooling head (vision_use_head): gemma3 reads the patches
  load_text(cfg_.text, ckpt, dtype, std::move(kernels), weights);
}

std::string Gemma3MmModel::vision_summary() const {
  return str("vision ", cfg_.vision.num_layers, " layers, hidden ", cfg_.vision.hidden_size);
}

ModelOutput Gemma3MmModel::forward(const Batch& batch, bool want_logits) {
  const Tokens t = tokens(batch);
  auto pv = batch.extras.find("pixel_values");
  // The splice positions and the image groups come from the host ids (Batch::to keeps a host copy).
  const int64_t n_tokens = t.ids_host.eq(cfg_.image_token_id).sum().item<int64_t>();
  const int64_t n_images = pv == batch.extras.end() ? 0 : pv->second.size(0);
  if (n_tokens != n_images * cfg_.mm_tokens_per_image)
    throw UsageError(str("gemma3: the batch holds ", n_tokens, " image tokens (id ", cfg_.image_token_id, ") but ", n_images,
                         " images of mm_tokens_per_image ", cfg_.mm_tokens_per_image, " need ", n_images * cfg_.mm_tokens_per_image));
  if (n_images == 0) return text_->forward(batch, want_logits);
  at::Tensor embeds = text_->embed_tokens(t.ids);
  at::Tensor feats = vision_->forward(pv->second).to(embeds.scalar_type());  // [n_tokens, H], images in order
  at::Tensor where = to_device_async(at::nonzero(t.ids_host.eq(cfg_.image_token_id)).squeeze(1), device_);
  embeds = embeds.index_put({where}, feats);
  at::Tensor groups = to_device_async(image_groups(t.ids_host, t.cu, cfg_.image_token_id), device_);
  return text_->forward_embeds(batch, want_logits, embeds, {}, {}, groups);
}

namespace {

class Gemma3MmFamily : public VlFamily {
 public:
  Gemma3MmFamily() : VlFamily(gemma3_mm_description()) {}

 protected:
  std::unique_ptr<VlModel> build(const json& hf_config, const ModelLoadOptions& o, const safetensors::Checkpoint& ckpt,
                                 at::ScalarType dtype) const override {
    Gemma3MmConfig cfg = parse_gemma3_mm_config(hf_config, (fs::path(o.dir) / "config.json").string());
    return std::make_unique<Gemma3MmModel>(std::move(cfg), ckpt, dtype, at::Device(o.device), o.kernels, o.weights);
  }

  Plan plan(const json& hf_config, const std::string& source, const safetensors::Checkpoint& ckpt) const override {
    Gemma3MmConfig cfg = parse_gemma3_mm_config(hf_config, source);
    auto vis = vl_vision_view(desc_, ckpt);
    for (const auto& [name, shape] : gemma3_vision_tensors(cfg))
      if (vis.info(name).shape != shape)
        throw UsageError(str(vis.file_of(name), ": tensor '", name, "' has shape ", ops::check::shape_str(vis.info(name).shape),
                             " but the config implies ", ops::check::shape_str(shape)));
    // The tower's attention is the decoder's op (in its plan already); the rest is ATen.
    return {cfg.text, str("gemma3: ", cfg.text.num_layers, " layers, hidden ", cfg.text.hidden_size, "; vision ", cfg.vision.num_layers, " layers"),
            {}, {}};
  }
};

}  // namespace

void register_gemma3_mm(Registry& registry) {
  Provider p;
  p.info.kind = ProviderKind::model;
  p.info.name = "gemma3";
  p.info.summary = "Gemma 3 multimodal (SigLIP tower + pooled projector, gemma3_text decoder with bidirectional image tokens)";
  p.object = std::shared_ptr<ModelFamily>(std::make_shared<Gemma3MmFamily>());
  registry.add(std::move(p));
}

}  // namespace ax::models
