// Gemma 3 multimodal (model_type "gemma3", Gemma3ForConditionalGeneration; gemma-3-4b/12b/27b): a SigLIP vision
// tower, the multimodal projector (average pooling to mm_tokens_per_image, a (1 + w) RMSNorm, a projection)
// whose soft tokens replace the image tokens of the text, and the gemma3_text decoder, in which the tokens of
// one image see each other (the attention op's bidirectional groups; causal elsewhere, windows as they are).
//
//   gemma3_mm.cpp         config.json -> Gemma3MmConfig, the vision tower and projector, the Model, the family
//
// The math follows transformers 5.23's modeling_gemma3.py and modeling_siglip.py; docs/models.md "## Gemma 3".
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "axengine/model.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "models/vlm.hpp"

namespace ax {
class KernelSet;
class Registry;
}  // namespace ax

namespace ax::models {

// adapter_config.json's exclude_modules in adapters we write: the SigLIP tower's q_proj / k_proj / v_proj
// would match the language model's target names.
inline constexpr const char* kSiglipExclude = ".*vision_tower.*";

// Registers the family (registry kind "model", "gemma3"); called by register_builtin_models.
void register_gemma3_mm(Registry& registry);

// SiglipVisionConfig, the keys the tower reads (its defaults).
struct SiglipConfig {
  int64_t hidden_size = 768, intermediate_size = 3072, num_layers = 12, num_heads = 12, num_channels = 3;
  int64_t image_size = 224, patch_size = 16;
  double layer_norm_eps = 1e-6;
  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t head_dim() const { return hidden_size / num_heads; }
};

struct Gemma3MmConfig {
  HfConfig text;  // the gemma3_text decoder
  SiglipConfig vision;
  int64_t mm_tokens_per_image = 256;
  int64_t image_token_id = 262144, boi_token_id = 255999, eoi_token_id = 256000;
  int64_t tokens_per_side() const;  // √mm_tokens_per_image
};

// Throws UsageError naming `source` and the key ("vision_config.<key>", "text_config.<key>" when nested).
Gemma3MmConfig parse_gemma3_mm_config(const nlohmann::json& j, const std::string& source);

// The checkpoint is read through gemma3_mm_description()'s views (models/vlm.hpp): the language model as
// model.* / lm_head.* (from language_model.model.* and language_model.lm_head.*, what transformers 5.23's
// save_pretrained writes, or model.language_model.*), the tower as vision_tower.* (from
// vision_tower.vision_model.*, vision_tower.*, model.vision_tower.*), the projector as multi_modal_projector.*
// (also under model.).

// The tower's and projector's tensors (names in the vision view) and their shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> gemma3_vision_tensors(const Gemma3MmConfig& c);

// The tower's linear layers (vision view module names): its LoRA sites (VlInspect::linears).
std::vector<std::string> gemma3_vision_linears(const Gemma3MmConfig& c);

// transformers' token_type_ids mask groups: every maximal run of image_token_id inside one span of `cu`
// (host int64, 0 ... T) is one group (ids 0, 1, ... in order), other tokens -1. int32 [T], host.
at::Tensor image_groups(const at::Tensor& ids, const at::Tensor& cu, int64_t image_token_id);

// `axengine init-model --preset tiny-gemma3-mm` (models/gemma3_mm_init.cpp): a tiny random model with Gemma 3's
// chat template, preprocessor_config.json and a tokenizer holding its image tokens.
void init_gemma3_mm_dir(const std::string& out_dir, uint64_t seed);

// The SigLIP tower and the projector: frozen, or with LoRA on the tower's linear layers (set_lora: the model's
// VisionLora, sites named as the tower's weights).
class Gemma3Vision {
 public:
  Gemma3Vision(const Gemma3MmConfig& cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
               std::shared_ptr<KernelSet> kernels);
  // pixel_values [N, C, image_size, image_size] -> soft tokens [N * mm_tokens_per_image, text hidden]. No autograd
  // unless a LoRA is set.
  at::Tensor forward(const at::Tensor& pixel_values) const;
  void set_lora(const VisionLora* lora) { lora_ = lora; }
  const std::vector<std::pair<std::string, at::Tensor>>& weights() const { return named_; }
  const std::vector<std::string>& used_keys() const { return used_; }

 private:
  const at::Tensor& w(const std::string& name) const;
  at::Tensor linear(const at::Tensor& x, const std::string& module) const;
  at::Tensor layer_norm(const at::Tensor& x, const std::string& module) const;
  at::Tensor layer(int64_t i, const at::Tensor& x, const at::Tensor& cu) const;

  Gemma3MmConfig cfg_;
  const VisionLora* lora_ = nullptr;
  at::ScalarType dtype_;
  at::Device device_;
  std::shared_ptr<KernelSet> kernels_;
  mutable std::shared_ptr<ops::Attention> attention_;
  std::map<std::string, at::Tensor> weights_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<std::string> used_;
};

class Gemma3MmModel : public VlModel {
 public:
  Gemma3MmModel(Gemma3MmConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights);
  // Reads Batch::extras "pixel_values" (float [n_images, C, S, S], the batch's images in token order); a batch
  // without it is text only. Image tokens must come mm_tokens_per_image per image.
  ModelOutput forward(const Batch& batch, bool want_logits) override;
  std::string vision_summary() const override;
  const Gemma3MmConfig& config() const { return cfg_; }

 protected:
  // VlDecode (models/gemma3_mm_decode.cpp; decode_text() is VlModel's).
  at::Tensor prefill_positions(const at::Tensor& ids, const DecodeImages& images) const override;
  DecoderModel::DecodeInputs splice_images(const at::Tensor& ids, const at::Tensor& cu, const DecodeImages& images) override;

 private:
  const std::vector<std::pair<std::string, at::Tensor>>& vision_weights() const override { return vision_->weights(); }

  Gemma3MmConfig cfg_;
  std::unique_ptr<Gemma3Vision> vision_;
};

}  // namespace ax::models
