// A Hugging Face config.json, reduced to what the decoder needs: the sizes and the typed architecture the
// family's description (models/family.hpp, models/families/<name>.cpp) reads from it.
// Parsing accepts both transformers 4.x spellings (rope_theta + rope_scaling, num_experts) and 5.x ones
// (rope_parameters, num_local_experts); anything missing, ill-typed or unsupported is a UsageError naming
// config.json and the key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "models/bnb_config.hpp"
#include "models/fp8_config.hpp"

namespace ax::models {

struct RopeConfig {
  std::string type = "default";  // default | linear | llama3 | yarn | dynamic
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position = 8192;                  // llama3, yarn
  double beta_fast = 32, beta_slow = 1;                  // yarn
  bool truncate = true;                                  // yarn: integer correction range
  // What transformers multiplies cos and sin by (yarn's attention_factor / mscale; 1 otherwise). RoPE is linear,
  // so q·k gains its square: the decoder folds that into the softmax scale.
  double attention_factor = 1.0;
  int64_t max_position = 0;  // dynamic: max_position_embeddings, beyond which the base grows
  // The share of head_dim rotated (Qwen3.5 / Qwen3-Next: ClassDefaults::partial_rotary_factor); the rest passes.
  double partial_rotary_factor = 1.0;
};

// How a sparse layer routes and runs its experts.
enum class MoeKind {
  // router `mlp.gate` (no bias) → softmax → top-k, renormalised when norm_topk_prob; experts SiLU GLU with
  // gate_up_proj = [gate; up] halves, no biases (qwen3_moe, mixtral, olmoe: DecoderModel::moe_block)
  softmax_topk,
  // router `mlp.router` with bias → top-k → softmax over the k logits; experts with biases and the clamped
  // sigmoid GLU on interleaved gate/up columns, stored transposed (gpt_oss: models/gpt_oss_moe.cpp)
  topk_softmax_clamped,
  // router `mlp.gate` (fp32, no bias) → sigmoid; the fp32 buffer mlp.gate.e_score_correction_bias steers the
  // group-limited top-k choice only; weights: the chosen sigmoids, renormalised when norm_topk_prob, times
  // routed_scaling_factor (models/parts/group_topk_router.hpp); experts as softmax_topk's (deepseek_v3, glm4_moe)
  group_topk_sigmoid,
};

struct HfConfig {
  std::string source;      // the file, for messages
  std::string model_type;  // the family (models/family.hpp)
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  // Biases as the family's transformers class builds them: llama's attention_bias sets all four attention
  // projections, qwen2 has q/k/v biases and none on o_proj.
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  bool qk_norm = false;  // qwen3 / qwen3_moe / gemma3_text: RMSNorm over head_dim of q and k before RoPE
  // olmoe: q_norm / k_norm are RMSNorms over the whole projection (num_heads·head_dim, num_kv_heads·head_dim),
  // before the split into heads; clip_qkv (> 0) clamps q, k and v to [-clip_qkv, clip_qkv] after them.
  bool qk_norm_full = false;
  double clip_qkv = 0.0;
  // gemma3_text: every RMSNorm scales by (1 + w); sandwich norms (the attention and MLP
  // outputs normed again before the residual add, a pre-feedforward norm); the softmax scale
  // query_pre_attn_scalar^-0.5 (0: 1/sqrt(head_dim)); embeddings times embed_scale (0: none); the MLP's gate
  // activation; sliding layers rotate with rope_local instead of rope.
  bool norm_offset = false, sandwich_norms = false;
  double attn_scale = 0.0, embed_scale = 0.0;
  std::string mlp_act = "silu";  // silu | gelu_pytorch_tanh
  bool has_local_rope = false;
  RopeConfig rope_local;
  const RopeConfig& rope_of(int64_t layer) const { return has_local_rope && window(layer) > 0 ? rope_local : rope; }
  // The attention window of each layer in tokens (the query itself included, transformers' sliding_window),
  // -1 = full causal attention. Empty = every layer full.
  std::vector<int64_t> layer_window;
  int64_t window(int64_t layer) const { return layer_window.empty() ? -1 : layer_window[layer]; }
  // Multimodal RoPE (qwen2_5_vl, models/qwen2_5_vl.hpp): the head_dim/2 frequencies in three sections rotated by
  // the temporal, height and width positions. Empty: one position per token.
  std::vector<int64_t> mrope_section;

  // MoE (num_experts == 0: dense)
  MoeKind moe_kind = MoeKind::softmax_topk;
  int64_t num_experts = 0, top_k = 0, moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  // qwen3_5_moe / qwen3_next: a shared expert beside the routed ones (models/parts/shared_expert.hpp); 0: none.
  int64_t shared_expert_intermediate_size = 0;
  // deepseek_v3 / glm4_moe: the shared experts are mlp.shared_experts.* (n_shared_experts · moe_intermediate_size)
  // without a gate, instead of Qwen's mlp.shared_expert.* times sigmoid(mlp.shared_expert_gate(x)).
  bool shared_experts_ungated = false;
  // MoeKind::group_topk_sigmoid's groups (n_group, topk_group) and scale.
  int64_t n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;  // HF adds coef * aux to the loss only when this is set

  // Per-head attention sinks (gpt_oss); the clamped GLU's constants (MoeKind::topk_softmax_clamped).
  bool attention_sinks = false;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  // quantization_config quant_method "mxfp4" (gpt_oss only): expert projections stored as `*_blocks` /
  // `*_scales` load packed (models/gpt_oss.hpp); the rest of the checkpoint is dense.
  bool mxfp4_experts = false;

  BnbConfig quant;  // a bitsandbytes 4-bit checkpoint's quantization_config (present = false: dense)
  Fp8Config fp8;    // a fine-grained FP8 checkpoint's (models/fp8_load.hpp: dequantised at load)

  // Qwen3.5 / Qwen3-Next (hybrid): RoPE on the first rotary_dim of head_dim (partial_rotary_factor; 0 = all of
  // it); q_proj doubled per head into q and an output gate, attention output · sigmoid(gate); the layers
  // linear_layers marks mix tokens with a Gated DeltaNet (models/parts/gated_deltanet.cpp) instead of attention.
  int64_t rotary_dim = 0;
  bool attn_output_gate = false;
  std::vector<bool> linear_layers;  // empty: none
  struct GatedDeltaNet {
    int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0, conv_kernel = 0;
    // Qwen3-Next: the projections fused into in_proj_qkvz and in_proj_ba, their rows grouped per key head
    // (transformers' fix_query_key_value_ordering; parts/gated_deltanet.cpp); Qwen3.5: four separate ones.
    bool fused = false;
  } gdn;
  // config.json is a multimodal checkpoint's (Qwen3_5ForConditionalGeneration): the decoder is its text_config,
  // its weights are under model.language_model. (checkpoint_text_view), the vision tower's are not read.
  bool text_part = false;
  // deepseek_v3: multi-head latent attention (models/parts/mla.hpp) on every layer instead of q/k/v_proj;
  // kv_lora_rank == 0: none. head_dim is qk_rope_head_dim there (what the RoPE rotates), as transformers sets it.
  struct Mla {
    int64_t q_lora_rank = 0;  // 0: q_proj (the config's null)
    int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
    bool rope_interleave = true;
    double softmax_scale = 0.0;  // with YaRN's mscale_all_dim correction (mla_softmax_scale)
  } mla;
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  bool is_linear_layer(int64_t layer) const { return !linear_layers.empty() && linear_layers[layer]; }
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }

  bool is_moe_layer(int64_t layer) const;
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
};

// `source` names the file in errors.
HfConfig parse_hf_config(const nlohmann::json& j, const std::string& source);
nlohmann::json read_json_file(const std::string& path);

// HF's rotary inverse frequencies (fp32 [head_dim/2]) for the rope type. `seq_len` matters to dynamic only:
// the longest position + 1 of the batch (transformers' dynamic_frequency_update on a fresh model: the base
// grows when seq_len > max_position_embeddings).
at::Tensor rope_inv_freq(const HfConfig& c, int64_t seq_len = 0);
// The same for another RoPE of the model (gemma3_text's rope_local).
at::Tensor rope_inv_freq(const HfConfig& c, const RopeConfig& rope, int64_t seq_len = 0);

}  // namespace ax::models
