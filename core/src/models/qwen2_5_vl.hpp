// Qwen2.5-VL (model_type "qwen2_5_vl", Qwen2_5_VLForConditionalGeneration): a vision transformer whose merged
// patch features replace the image placeholder tokens of the text, and the qwen2 decoder with multimodal RoPE.
//
//   qwen2_5_vl_config.cpp  config.json (transformers 4 top-level text keys, or 5's text_config) -> VlConfig
//   qwen2_5_vl_vision.cpp  the vision tower: patch embedding, window/full attention blocks, 2x2 patch merger
//   qwen2_5_vl_model.cpp   the rope index (transformers' get_rope_index), image-token splicing, the Model and
//                          its family
//
// The math follows transformers 5.23's modeling_qwen2_5_vl.py; docs/models.md lists what is supported.
#pragma once
#include <array>
#include <cstdint>
#include <map>
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
#include "models/vlm.hpp"

namespace ax {
class KernelSet;
class Registry;
class Tokenizer;
}

namespace ax::models {

// adapter_config.json's exclude_modules in adapters we write: peft leaves the vision tower without LoRA (its
// MLP's gate_proj / up_proj / down_proj would match the language model's target names).
inline constexpr const char* kVisionExclude = ".*visual.*";

// Registers the family (registry kind "model", "qwen2_5_vl"); called by register_builtin_models.
void register_qwen2_5_vl(Registry& registry);

// Qwen2_5_VLVisionConfig, the keys the tower reads.
struct VisionConfig {
  int64_t depth = 32, hidden_size = 3584, intermediate_size = 3420, num_heads = 16, out_hidden_size = 3584;
  int64_t in_channels = 3, patch_size = 14, temporal_patch_size = 2, spatial_merge_size = 2, window_size = 112;
  std::vector<int64_t> fullatt_block_indexes{7, 15, 23, 31};
  double rope_theta = 10000.0;  // the 2-D (axial) rotary of the tower
  int64_t head_dim() const { return hidden_size / num_heads; }
  // One flattened patch: channels x temporal x patch x patch (1176 for 3 x 2 x 14 x 14).
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
};

struct VlConfig {
  std::string source;
  HfConfig text;  // the language model as a qwen2 decoder, with text.mrope_section set
  VisionConfig vision;
  int64_t image_token_id = 151655, video_token_id = 151656;
  int64_t vision_start_token_id = 151652, vision_end_token_id = 151653;
};

// Throws UsageError naming `source` and the key (text keys as "text_config.<key>" when nested).
VlConfig parse_qwen2_5_vl_config(const nlohmann::json& j, const std::string& source);

// The tower's tensors (under `prefix`) against its config, from the headers: the block count first (so a config
// claiming more blocks than stored is refused before anything is listed: check_vision_blocks), then each
// tensor's presence, shape and dtype, with the messages the tower's load gives.
void check_vision_blocks(const VisionConfig& v, const safetensors::Checkpoint& ckpt, const std::string& prefix);
void check_vision_checkpoint(const VisionConfig& v, const safetensors::Checkpoint& ckpt, const std::string& prefix);

// The image grids of a batch, on the host: image i has grid_thw[i] = {t, h, w} in patches.
using Grids = std::vector<std::array<int64_t, 3>>;
Grids read_grids(const at::Tensor& image_grid_thw, const VisionConfig& v);  // validates shape, values, merge
// The same for any family whose tower merges `merge` x `merge` patches (`family` prefixes the messages).
Grids read_grids(const at::Tensor& image_grid_thw, int64_t merge, const std::string& family);
// Each patch's (h, w) in its frame, in the processor's block-major order (get_vision_position_ids): int64 [N, 2].
at::Tensor patch_hw(const Grids& grids, int64_t merge);
// The vision towers' 2-D rotary angles (Qwen2_5_VLVisionRotaryEmbedding, Qwen3VLVisionRotaryEmbedding): D/4
// frequencies of `theta` for h, D/4 for w, the pair repeated: fp32 [N, D] on `device`, patches in patch_hw's order.
at::Tensor vision_rope_angles(const Grids& grids, int64_t merge, int64_t head_dim, double theta, at::Device device);
// A vision block's attention (both towers'): qkv [N, 3·H·D] into heads, q and k rotated by cos / sin [N, 1, D]
// (apply_rotary_pos_emb_vision: rotate-half in fp32, back to the compute dtype), then bidirectional attention
// within each span of cu (int32; the longest max_len) through `attention`. [N, H·D].
at::Tensor vision_rotary_attention(const std::shared_ptr<ops::Attention>& attention, const at::Tensor& qkv, int64_t heads,
                                   const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& cu, int64_t max_len);

// What the rope index reads of a family's config (qwen2_5_vl, qwen3_vl: the same get_rope_index for images).
struct MropeTokens {
  int64_t merge = 2, image_token_id = 0, video_token_id = 0;
  std::string family;  // prefixes the messages
};

// transformers' get_rope_index for the flattened tokens `ids` (int64 [T], host), split into spans by `cu`
// (host int64, 0 ... T): positions restart at 0 in every span (a packed sample or padding). Text tokens count
// on from the span's current position on all three axes; each maximal run of image_token_id is one image (the
// next grid, in order) at positions (t, h, w) + the current position, after which the position advances by
// max(h, w) / merge. A run whose length is not t·h·w / merge² is an error, as is a grid left over. int64 [3, T].
at::Tensor mrope_positions(const at::Tensor& ids, const at::Tensor& cu, const Grids& grids, const VlConfig& cfg);
at::Tensor mrope_positions(const at::Tensor& ids, const at::Tensor& cu, const Grids& grids, const MropeTokens& tokens);

// The tower's checkpoint tensors (names without the "visual." prefix) and their shapes under `v`.
std::vector<std::pair<std::string, std::vector<int64_t>>> vision_checkpoint_tensors(const VisionConfig& v);

// What the vision-language presets (qwen2_5_vl_init.cpp, qwen3_vl_init.cpp) share: a byte-level tokenizer with
// Qwen's vision tokens, the tiny text config, and the directory writer (random weights as HF's _init_weights,
// config.json, generation_config.json, preprocessor_config.json, the tokenizer files).
struct VlPresetTokenizer {
  std::string tokenizer_json, tokenizer_config;  // the files' text
  std::shared_ptr<Tokenizer> tokenizer;
  int64_t vocab = 0;  // the embedding rows: the tokenizer's size padded to a multiple of 64
  int64_t id(const std::string& text) const;  // the single token of `text`
  nlohmann::json token_ids() const;  // image_token_id, video_token_id, vision_start_token_id, vision_end_token_id
};
VlPresetTokenizer make_vl_preset_tokenizer();
// A 2-layer decoder of hidden 64 (4 heads, 2 kv heads of head_dim 16), the tokenizer's specials.
nlohmann::json vl_preset_text_config(const VlPresetTokenizer& tok, const std::string& model_type);
struct VlPreset {
  std::string name;
  nlohmann::json config, preprocessor;
  HfConfig text;  // the language model's tensors: expected_checkpoint_tensors(text)
  std::vector<std::pair<std::string, std::vector<int64_t>>> vision;  // the tower's, without "visual."
  bool module_tree_names = false;  // write model.language_model.*, model.visual.* (else model.*, visual.*)
};
void write_vl_preset(const std::string& out_dir, uint64_t seed, const VlPresetTokenizer& tok, const VlPreset& preset);

// `axengine init-model --preset tiny-qwen2_5-vl` (models/qwen2_5_vl_init.cpp): a tiny random Qwen2.5-VL in
// `out_dir` (config.json as transformers 5 writes it, model.safetensors, preprocessor_config.json with small
// pixel bounds, a byte-level tokenizer holding the vision tokens). Real patch geometry (14 x 14, temporal 2,
// merge 2): the mm_cpt processor's [N, 1176] pixel_values fit it.
void init_qwen2_5_vl_dir(const std::string& out_dir, uint64_t seed);

// The frozen vision tower (weights under transformers' names without the "visual." prefix).
class VisionTower {
 public:
  VisionTower(const VisionConfig& cfg, const safetensors::Checkpoint& ckpt, const std::string& prefix,
              at::ScalarType dtype, at::Device device, std::shared_ptr<KernelSet> kernels);
  // pixel_values [N, patch_dim] (all images, in order), grids summing to N patches -> merged features
  // [N / merge², out_hidden_size] in the images' order. No autograd: the tower is frozen.
  at::Tensor forward(const at::Tensor& pixel_values, const Grids& grids) const;
  const std::vector<std::pair<std::string, at::Tensor>>& weights() const { return named_; }  // checkpoint names
  const std::vector<std::string>& used_keys() const { return used_; }
  // Every kernel call of forward (what the constructor resolves and the family's check lists): its linears
  // (dense, with bias), RMSNorms, the window/full attention (non-causal, no sinks) and the SwiGLU MLP.
  static std::vector<OpCall> calls();

 private:
  const at::Tensor& w(const std::string& name) const;
  at::Tensor linear(const at::Tensor& x, const std::string& module) const;  // weight + bias
  at::Tensor rms_norm(const at::Tensor& x, const std::string& weight) const;
  at::Tensor block(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& cu, int64_t max_len) const;

  VisionConfig cfg_;
  at::ScalarType dtype_;
  at::Device device_;
  std::shared_ptr<KernelSet> kernels_;
  mutable std::shared_ptr<ops::Attention> attention_;  // the attention backend with its fallbacks (attention_chain_of), made on first use
  std::map<std::string, at::Tensor> weights_;
  std::vector<std::pair<std::string, at::Tensor>> named_;
  std::vector<std::string> used_;
};

class Qwen25VlModel : public VlModel {
 public:
  Qwen25VlModel(VlConfig cfg, const safetensors::Checkpoint& ckpt, at::ScalarType dtype, at::Device device,
                std::shared_ptr<KernelSet> kernels, const WeightPolicy& weights);

  // Reads Batch::extras "pixel_values" (float [N, patch_dim]) and "image_grid_thw" (int64 [n_images, 3]),
  // both concatenated over the batch's samples in token order; a batch without them is text only.
  ModelOutput forward(const Batch& batch, bool want_logits) override;
  std::string vision_summary() const override;
  const VlConfig& config() const { return cfg_; }

 protected:
  // VlDecode (models/qwen_vl_decode.cpp; decode_text() is VlModel's).
  at::Tensor prefill_positions(const at::Tensor& ids, const DecodeImages& images) const override;
  DecoderModel::DecodeInputs splice_images(const at::Tensor& ids, const at::Tensor& cu, const DecodeImages& images) override;

 private:
  const std::vector<std::pair<std::string, at::Tensor>>& vision_weights() const override { return vision_->weights(); }

  VlConfig cfg_;
  std::unique_ptr<VisionTower> vision_;
};

}  // namespace ax::models
