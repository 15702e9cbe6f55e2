// olmoe (OlmoeForCausalLM, OlmoeConfig): q_norm / k_norm over the whole q and k projections before the split
// into heads, clip_qkv, and every layer sparse: softmax → top-k (norm_topk_prob, default false) over SiLU-GLU
// experts of intermediate_size. peft maps its expert names like qwen2_moe's.
#include <cmath>

#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

const Family& olmoe_family() {
  static const Family f = [] {
    Family f;
    f.name = "olmoe";
    f.config_class = "OlmoeConfig";
    f.summary = "OLMoE sparse MoE (q/k RMSNorm over all heads, softmax top-k router)";
    f.defaults = {1e-5, 1e4, 0, 0, false, nullptr};
    f.reads_attention_bias = true;
    f.moe = true;
    f.per_expert = PerExpertNames{"gate_proj", "up_proj", "down_proj", ""};
    f.read = [](const Reader& r, HfConfig& c) {
      // OlmoeAttention sizes q_norm as hidden_size and k_norm as (hidden_size / heads) · kv_heads, and its
      // config has no head_dim: a different one would not load in transformers.
      if (c.head_dim * c.num_heads != c.hidden_size)
        throw r.bad("head_dim", str(c.head_dim, " is not hidden_size / num_attention_heads = ", c.hidden_size, " / ",
                                    c.num_heads, " (olmoe derives it)"));
      c.qk_norm_full = true;
      if (r.has("clip_qkv")) {
        c.clip_qkv = r.number_or("clip_qkv", 0);
        if (!(c.clip_qkv > 0) || !std::isfinite(c.clip_qkv))
          throw r.bad("clip_qkv", str("must be null or a finite number > 0, got ", c.clip_qkv));
      }
      read_experts(r, c, 0.01);
      c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
    };
    f.presets = {{"tiny-olmoe", [](nlohmann::json& c) {
                    c.update({{"architectures", {"OlmoeForCausalLM"}}, {"model_type", "olmoe"}, {"intermediate_size", 32},
                              {"num_experts", 8}, {"num_experts_per_tok", 2}, {"norm_topk_prob", false},
                              {"router_aux_loss_coef", 0.01}, {"output_router_logits", false}, {"clip_qkv", nullptr},
                              {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"attention_bias", false},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
