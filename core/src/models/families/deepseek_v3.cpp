// deepseek_v3 (DeepseekV3ForCausalLM, DeepseekV3Config: DeepSeek-V3 / R1, Kimi K2, Moonlight): multi-head latent
// attention on every layer (models/parts/mla_layer.hpp: q through q_a_proj → q_a_layernorm → q_b_proj, or q_proj
// when q_lora_rank is null; the compressed KV and a shared rope key from kv_a_proj_with_mqa; RoPE on the rope dims
// only, interleaved when rope_interleave; v_head_dim ≠ the qk head dim; the softmax scale with YaRN's mscale_all_dim
// correction), and glm4_moe's sparse MLP (families/glm4_moe.cpp: the group-limited sigmoid router, shared experts,
// dense first layers; no aux loss). Experts saved per expert, loaded in either form; the MTP layer the checkpoints
// append (model.layers.61.*) is not read, as transformers leaves it.
//
// LoRA targets (peft's names): q_a_proj, q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj; gate_proj +
// up_proj and down_proj select the routed experts (peft's MoE conversion, as for glm4_moe).
#include <cmath>

#include "models/config_reader.hpp"
#include "models/family.hpp"
#include "models/parts/group_topk_router.hpp"
#include "models/parts/mla.hpp"

namespace ax::models {

namespace {

// A size key: the class default when absent; null refused where the class cannot build the model without it.
int64_t mla_size(const Reader& r, const char* key, int64_t def) {
  if (r.j.contains(key) && r.j[key].is_null()) throw r.bad(key, "must be a positive integer (DeepseekV3Attention cannot be built without it)");
  const int64_t v = r.has(key) ? r.positive(key) : def;
  if (v > (int64_t(1) << 20)) throw r.bad(key, str("is ", v, ", more than ", int64_t(1) << 20));
  return v;
}

void read_deepseek_v3(const Reader& r, HfConfig& c) {
  auto& m = c.mla;
  // q_lora_rank null (DeepSeek-V2-Lite, Moonlight's config style): a plain q_proj.
  m.q_lora_rank = r.j.contains("q_lora_rank") && r.j["q_lora_rank"].is_null() ? 0 : mla_size(r, "q_lora_rank", 1536);
  m.kv_lora_rank = mla_size(r, "kv_lora_rank", 512);
  m.qk_nope_head_dim = mla_size(r, "qk_nope_head_dim", 128);
  m.qk_rope_head_dim = mla_size(r, "qk_rope_head_dim", 64);
  m.v_head_dim = mla_size(r, "v_head_dim", 128);
  if (m.qk_rope_head_dim % 2 != 0) throw r.bad("qk_rope_head_dim", str("must be even for RoPE, got ", m.qk_rope_head_dim));
  m.rope_interleave = r.boolean_or("rope_interleave", true);
  // Every head has its own k and v (expanded from the latent): a num_key_value_heads other than the heads would
  // make transformers' attention repeat them again (and fail).
  if (c.num_kv_heads != c.num_heads)
    throw r.bad("num_key_value_heads", str(c.num_kv_heads, " must equal num_attention_heads ", c.num_heads,
                                           " (multi-head latent attention expands k and v for every head)"));
  // DeepseekV3Config sets head_dim to the rope dims (what the RoPE rotates), whatever config.json says.
  c.head_dim = m.qk_rope_head_dim;
  c.rotary_dim = 0;
  // attention_bias: biases on q_a_proj, kv_a_proj_with_mqa and o_proj (DeepseekV3Attention).
  // (the shared reader set qkv_bias = o_bias from it.)
  // The softmax scale: (nope + rope)^-1/2 times mscale(factor, mscale_all_dim)^2 under a non-default RoPE.
  const nlohmann::json* rp = r.has("rope_parameters") ? &r.j["rope_parameters"] : r.has("rope_scaling") ? &r.j["rope_scaling"] : nullptr;
  const double mscale_all_dim = rp && rp->is_object() ? Reader{*rp, r.source}.number_or("mscale_all_dim", 0.0) : 0.0;
  m.softmax_scale = mla_softmax_scale(m.qk_nope_head_dim + m.qk_rope_head_dim, c.rope.type == "default", c.rope.factor, mscale_all_dim);
  read_group_moe_keys(r, c, {18432, 2048, 256, 8, 8, 4, 3, 2.5});
}

}  // namespace

const Family& deepseek_v3_family() {
  static const Family f = [] {
    Family f;
    f.name = "deepseek_v3";
    // Kimi K2's config.json says model_type "kimi_k2" (its remote code's name for DeepseekV3Config, architecture
    // DeepseekV3ForCausalLM, the same keys): read as this family.
    f.also_types = {"kimi_k2"};
    f.config_class = "DeepseekV3Config";
    f.summary = "DeepSeek-V3 / Kimi K2 (multi-head latent attention, group-limited sigmoid router, shared experts)";
    f.defaults.rms_norm_eps = 1e-6;
    f.defaults.head_dim = 64;  // the rope dims (qk_rope_head_dim): set by the reader
    f.defaults.num_kv_heads = 128;  // must be num_attention_heads (the reader says so)
    f.moe = true;
    f.experts_key = "n_routed_experts";
    f.per_expert = PerExpertNames{"gate_proj", "up_proj", "down_proj", ""};
    f.read = read_deepseek_v3;
    // attention_bias is this family's own (biases on q_a_proj, kv_a_proj_with_mqa, o_proj): read above.
    f.reads_attention_bias = true;
    f.presets = {{"tiny-deepseek-v3", [](nlohmann::json& c) {
                    // DeepSeek-V3's layout, tiny: q LoRA rank 24, latent 16, qk 12 + rope 8, v 10 (≠ qk), YaRN with
                    // mscale_all_dim as the hub config has it, layer 0 dense, 8 experts in 4 groups (top-2 of the 2 best
                    // groups), routed_scaling_factor 2.5, one shared expert.
                    c.update({{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"},
                              {"num_key_value_heads", 4}, {"head_dim", 8}, {"q_lora_rank", 24}, {"kv_lora_rank", 16},
                              {"qk_nope_head_dim", 12}, {"qk_rope_head_dim", 8}, {"v_head_dim", 10}, {"rope_interleave", true},
                              {"intermediate_size", 128}, {"moe_intermediate_size", 32}, {"n_routed_experts", 8},
                              {"num_experts_per_tok", 2}, {"n_group", 4}, {"topk_group", 2}, {"n_shared_experts", 1},
                              {"first_k_dense_replace", 1}, {"routed_scaling_factor", 2.5}, {"norm_topk_prob", true},
                              {"attention_bias", false}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false},
                              {"max_position_embeddings", 2560},
                              {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},
                                                   {"mscale", 1.0}, {"mscale_all_dim", 1.0}, {"beta_fast", 32.0},
                                                   {"beta_slow", 1.0}, {"original_max_position_embeddings", 64}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
