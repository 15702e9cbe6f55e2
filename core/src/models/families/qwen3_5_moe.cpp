// qwen3_5_moe (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig; the text part of the Qwen3.5-MoE checkpoints): qwen3_5's
// hybrid layers (families/qwen3_5.cpp) with a sparse MLP on every layer: a softmax → top-k router whose k weights
// are always renormalised, SiLU-GLU experts of moe_intermediate_size (moe.mlp), and a shared expert (a SiLU GLU of
// shared_expert_intermediate_size) times sigmoid(shared_expert_gate(x)) added to them. Qwen3_5MoeForCausalLM saves
// model_type "qwen3_5_moe_text" and its experts per expert (mlp.experts.{e}.gate_proj...).
//
// LoRA targets as peft 0.21.2 takes them on transformers 5.23's model: this family's targets are not converted
// (its conversion pattern is qwen3_5_text's, which has no MoE mapping), so gate_proj / up_proj / down_proj name the
// shared expert's modules; the routed experts are targeted by their parameters (gate_up_proj,
// mlp.experts.down_proj: peft's target_parameters).
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

void read_qwen3_5_hybrid(const Reader& r, HfConfig& c, int64_t interval_default);  // families/qwen3_5.cpp

namespace {
int64_t positive_or(const Reader& r, const char* key, int64_t def) { return r.has(key) ? r.positive(key) : def; }
}  // namespace

// The MoE keys of Qwen3.5-MoE and Qwen3-Next (their classes' defaults given): experts, top-k, the expert and shared
// expert sizes, the aux loss; every layer sparse, the top-k weights renormalised.
void read_qwen3_5_moe_keys(const Reader& r, HfConfig& c, int64_t experts, int64_t top_k, int64_t moe_size, int64_t shared_size) {
  c.num_experts = positive_or(r, "num_experts", experts);
  c.top_k = positive_or(r, "num_experts_per_tok", top_k);
  if (c.top_k > c.num_experts)
    throw r.bad("num_experts_per_tok", str(c.top_k, " exceeds the number of experts ", c.num_experts));
  c.moe_intermediate_size = positive_or(r, "moe_intermediate_size", moe_size);
  c.shared_expert_intermediate_size = positive_or(r, "shared_expert_intermediate_size", shared_size);
  c.norm_topk_prob = true;  // the router renormalises unconditionally
  c.router_aux_loss_coef = r.number_or("router_aux_loss_coef", 0.001);
  c.output_router_logits = r.boolean_or("output_router_logits", false);
}

const Family& qwen3_5_moe_family() {
  static const Family f = [] {
    Family f;
    f.name = "qwen3_5_moe";
    f.also_types = {"qwen3_5_moe_text"};
    f.reads_text_config = true;  // Qwen3_5MoeForConditionalGeneration (the hub's Qwen3.5-MoE checkpoints)
    f.config_class = "Qwen3_5MoeTextConfig";
    f.summary = "Qwen3.5 MoE hybrid (Gated DeltaNet + gated attention; routed experts and a sigmoid-gated shared expert)";
    f.defaults.num_kv_heads = 2;
    f.defaults.head_dim = 256;
    f.defaults.partial_rotary_factor = 0.25;
    f.reads_attention_bias = true;
    f.moe = true;
    f.read = [](const Reader& r, HfConfig& c) {
      read_qwen3_5_hybrid(r, c, 4);
      read_qwen3_5_moe_keys(r, c, 256, 8, 512, 512);
    };
    f.presets = {{"tiny-qwen3_5-moe", [](nlohmann::json& c) {
                    c.update({{"architectures", {"Qwen3_5MoeForCausalLM"}}, {"model_type", "qwen3_5_moe_text"}, {"head_dim", 16},
                              {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false}, {"attention_bias", false},
                              {"layer_types", {"linear_attention", "full_attention"}}, {"linear_conv_kernel_dim", 4},
                              {"linear_key_head_dim", 16}, {"linear_value_head_dim", 16}, {"linear_num_key_heads", 2},
                              {"linear_num_value_heads", 4}, {"num_experts", 6}, {"num_experts_per_tok", 2},
                              {"moe_intermediate_size", 32}, {"shared_expert_intermediate_size", 48},
                              {"router_aux_loss_coef", 0.001}, {"output_router_logits", false},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
