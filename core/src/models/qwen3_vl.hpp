// Qwen3-VL (model_type "qwen3_vl", Qwen3VLForConditionalGeneration): a vision transformer with learned position
// embeddings, whose merged patch features replace the image placeholder tokens and whose intermediate features
// (deepstack) are added to the hidden states of the first decoder layers at those tokens; the qwen3 decoder
// (q/k norms) with interleaved multimodal RoPE.
//
//   qwen3_vl_config.cpp  config.json (text_config, vision_config) -> Qwen3VlConfig
//   qwen3_vl_vision.cpp  the vision tower: patch embedding + interpolated positions, blocks, merger, deepstack
//   qwen3_vl_model.cpp   the Model (rope index and splicing shared with qwen2_5_vl) and its family
//   qwen3_vl_init.cpp    `init-model --preset tiny-qwen3-vl`
//   qwen3_vl_moe.cpp     the qwen3_vl_moe variant (a qwen3_moe decoder): its config, family and preset
//
// The math follows transformers 5.23's modeling_qwen3_vl.py; docs/models.md lists what is supported.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "axengine/model.hpp"
#include "axengine/model_check.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "models/qwen2_5_vl.hpp"

namespace ax::models {

// Registers the family (registry kind "model", "qwen3_vl"); called by register_builtin_models.
void register_qwen3_vl(Registry& registry);

// Qwen3VLVisionConfig, the keys the tower reads (defaults: the class's).
struct Qwen3VisionConfig {
  int64_t depth = 27, hidden_size = 1152, intermediate_size = 4304, num_heads = 16, out_hidden_size = 3584;
  int64_t in_channels = 3, patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2;
  int64_t num_position_embeddings = 2304;  // a square grid of learned positions, side sqrt(n)
  std::vector<int64_t> deepstack_visual_indexes{8, 16, 24};
  std::string hidden_act = "gelu_pytorch_tanh";  // the blocks' MLP; the mergers use GELU (erf)
  double rope_theta = 10000.0;
  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  int64_t grid_side() const;  // int(sqrt(num_position_embeddings)), as transformers truncates it
};

struct Qwen3VlConfig {
  std::string source;
  // The language model as a qwen3 decoder. text.mrope_section holds the interleaved layout as contiguous
  // sections (see interleaved_sections); `mrope_section` is the config's three sizes.
  HfConfig text;
  std::vector<int64_t> mrope_section;
  Qwen3VisionConfig vision;
  int64_t image_token_id = 151655, video_token_id = 151656;
  int64_t vision_start_token_id = 151652, vision_end_token_id = 151653;
  MropeTokens rope_tokens() const {
    return {vision.spatial_merge_size, image_token_id, video_token_id, "qwen3_vl"};
  }
};

// Throws UsageError naming `source` and the key.
Qwen3VlConfig parse_qwen3_vl_config(const nlohmann::json& j, const std::string& source);

// A Qwen3-VL variant's language model: the top-level model_type, the decoder family its text_config is read as,
// and the text config class's value of each key text_config leaves out (null: one the class derives).
struct Qwen3VlTextClass {
  std::string model_type, decoder_type;
  nlohmann::json defaults;
};
Qwen3VlConfig parse_qwen3_vl_config(const nlohmann::json& j, const std::string& source, const Qwen3VlTextClass& cls);

// Qwen3-VL-MoE (model_type "qwen3_vl_moe", Qwen3VLMoeForConditionalGeneration; models/qwen3_vl_moe.cpp): the same
// tower, deepstack and interleaved mrope, with a qwen3_moe decoder (Qwen3VLMoeTextConfig's defaults; the router
// always renormalises its top-k weights). Its checkpoints hold the fused experts transposed (gate_up_proj
// [E, H, 2I], down_proj [E, I, H]): the decoder's checkpoint map reads them so (models/decoder_checkpoint.cpp).
Qwen3VlConfig parse_qwen3_vl_moe_config(const nlohmann::json& j, const std::string& source);
void register_qwen3_vl_moe(Registry& registry);
// `axengine init-model --preset tiny-qwen3-vl-moe`: tiny-qwen3-vl with a 2-layer MoE decoder (the second layer
// dense through mlp_only_layers).
void init_qwen3_vl_moe_dir(const std::string& out_dir, uint64_t seed);

// The family of a Qwen3-VL variant (models/qwen3_vl_model.cpp): its description (models/vlm.hpp: the name, LoRA
// family, preset), summary and config parser.
struct Qwen3VlVariant {
  const VlDescription& (*description)() = nullptr;
  std::string summary;
  Qwen3VlConfig (*parse)(const nlohmann::json& j, const std::string& source) = nullptr;
};
void register_qwen3_vl_variant(Registry& registry, const Qwen3VlVariant& variant);
// What `axengine inspect` shows of a variant's model (its tower, under the architecture line given).
VlInspect qwen3_vl_inspect(const Qwen3VlConfig& vl, const std::string& architecture);

// Qwen3VLTextRotaryEmbedding's interleaved layout of the head_dim/2 frequencies: frequency j rotates by the
// height position when j % 3 == 1 and j < 3·section[1], by the width position when j % 3 == 2 and
// j < 3·section[2], else by the temporal one. Written as the contiguous sections the decoder's multimodal RoPE
// reads (section s takes axis s % 3; empty sections skip an axis), e.g. {4, 2, 2} of 8 -> {1, 1, 1, 1, 1, 1, 2}.
std::vector<int64_t> interleaved_sections(const std::vector<int64_t>& section, int64_t half_dim);

// `axengine init-model --preset tiny-qwen3-vl` (models/qwen3_vl_init.cpp): a tiny random Qwen3-VL in `out_dir`.
void init_qwen3_vl_dir(const std::string& out_dir, uint64_t seed);
// The tiny preset of a variant: tiny-qwen3-vl's tower and decoder with `text_keys` added to its text_config.
struct Qwen3VlPresetSpec {
  std::string preset, model_type, architecture;
  nlohmann::json text_keys;
  Qwen3VlConfig (*parse)(const nlohmann::json& j, const std::string& source) = nullptr;
};
void init_qwen3_vl_variant_dir(const std::string& out_dir, uint64_t seed, const Qwen3VlPresetSpec& spec);

// The tower's checkpoint tensors (names without the "visual." prefix) and their shapes under `v`.
std::vector<std::pair<std::string, std::vector<int64_t>>> qwen3_vision_tensors(const Qwen3VisionConfig& v);
void check_qwen3_vision_checkpoint(const Qwen3VisionConfig& v, const safetensors::Checkpoint& ckpt, const std::string& prefix);

// transformers' get_vision_interpolation_indices_and_weights (bilinear, align_corners): for every patch, in the
// processor's block-major order, the 4 rows of the learned position table and their weights. {int64 [N, 4],
// fp32 [N, 4]}, on the host.
std::pair<at::Tensor, at::Tensor> position_taps(const Grids& grids, int64_t merge, int64_t side);

// The vision tower (weights under transformers' names without the "visual." prefix): frozen, or with LoRA on its
// linear layers (set_lora: the model's VisionLora, whose sites are named with the prefix).
class Qwen3VisionTower {
 public:
  Qwen3VisionTower(const Qwen3VisionConfig& cfg, const safetensors::Checkpoint& ckpt, const std::string& prefix,
                   at::ScalarType dtype, at::Device device, std::shared_ptr<KernelSet> kernels);
  struct Features {
    at::Tensor merged;                // [N / merge², out_hidden_size]: replaces the image tokens' embeddings
    std::vector<at::Tensor> deepstack;  // one per deepstack_visual_indexes, in block order: added after decoder layer k
  };
  // pixel_values [N, patch_dim] (all images, in order), grids summing to N patches. No autograd unless a LoRA
  // is set (then the graph reaches its factors).
  Features forward(const at::Tensor& pixel_values, const Grids& grids) const;
  void set_lora(const VisionLora* lora) { lora_ = lora; }
  const std::vector<std::pair<std::string, at::Tensor>>& weights() const { return named_; }  // checkpoint names
  const std::vector<std::string>& used_keys() const { return used_; }
  static std::vector<OpCall> calls();  // the attention; everything else is ATen

 private:
  const at::Tensor& w(const std::string& name) const;
  at::Tensor linear(const at::Tensor& x, const std::string& module) const;  // weight + bias
  at::Tensor layer_norm(const at::Tensor& x, const std::string& module) const;
  at::Tensor merger(const at::Tensor& x, const std::string& module, bool postshuffle_norm) const;
  at::Tensor block(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cu,
                   int64_t max_len) const;

  Qwen3VisionConfig cfg_;
  std::string prefix_;  // the vision view's prefix of the tower's names ("visual.")
  const VisionLora* lora_ = nullptr;
  at::ScalarType dtype_;
  at::Device device_;
  std::shared_ptr<KernelSet> kernels_;
  mutable std::shared_ptr<ops::Attention> attention_;
  std::map<std::string, at::Tensor> weights_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<std::string> used_;
};

class Qwen3VlModel : public VlModel {
 public:
  // `desc`: the variant's (qwen3_vl_description() or qwen3_vl_moe_description()).
  Qwen3VlModel(const VlDescription& desc, Qwen3VlConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype,
               at::Device device, std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights);

  // Batch::extras "pixel_values" and "image_grid_thw" as for qwen2_5_vl (models/qwen2_5_vl.hpp).
  ModelOutput forward(const Batch& batch, bool want_logits) override;
  std::string vision_summary() const override;
  const Qwen3VlConfig& config() const { return cfg_; }

 protected:
  // VlDecode (models/qwen_vl_decode.cpp; decode_text() is VlModel's).
  at::Tensor prefill_positions(const at::Tensor& ids, const DecodeImages& images) const override;
  DecoderModel::DecodeInputs splice_images(const at::Tensor& ids, const at::Tensor& cu, const DecodeImages& images) override;

 private:
  const std::vector<std::pair<std::string, at::Tensor>>& vision_weights() const override { return vision_->weights(); }

  Qwen3VlConfig cfg_;
  std::unique_ptr<Qwen3VisionTower> vision_;
};

}  // namespace ax::models
