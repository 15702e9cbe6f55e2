// qwen3_next (Qwen3NextForCausalLM, Qwen3NextConfig): qwen3_5_moe's hybrid layers (families/qwen3_5.cpp,
// qwen3_5_moe.cpp) with the Gated DeltaNet's projections fused into in_proj_qkvz and in_proj_ba, their rows grouped
// per key head (HfConfig::gdn.fused, parts/gated_deltanet.cpp); sparse layers chosen by decoder_sparse_step and
// mlp_only_layers (the others a dense SiLU GLU of intermediate_size), a softmax → top-k router renormalised when
// norm_topk_prob, and the sigmoid-gated shared expert (parts/shared_expert.cpp). The checkpoints save the experts
// per expert (mlp.experts.{e}.gate_proj...); transformers 5.23 fuses them at load (conversion pattern qwen2_moe).
//
// LoRA targets as peft 0.21.2 takes them on transformers 5.23's model: the family's conversion pattern is
// qwen2_moe's, so peft converts gate_proj / up_proj / down_proj to the routed experts' parameters (gate_up_proj at
// rank 2r), as for qwen3_moe (per_expert below): neither the shared expert's MLP nor a dense layer's is targeted by
// those names. in_proj_qkvz, in_proj_ba, out_proj, q/k/v/o_proj and shared_expert_gate are modules.
// The hub checkpoints' multi-token-prediction weights (mtp.*) are not read, as transformers does not read them.
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

void read_qwen3_5_hybrid(const Reader& r, HfConfig& c, int64_t interval_default);  // families/qwen3_5.cpp
void read_qwen3_5_moe_keys(const Reader& r, HfConfig& c, int64_t experts, int64_t top_k, int64_t moe_size,
                           int64_t shared_size);         // families/qwen3_5_moe.cpp
void read_sparse_layers(const Reader& r, HfConfig& c);  // families/qwen3_moe.cpp

const Family& qwen3_next_family() {
  static const Family f = [] {
    Family f;
    f.name = "qwen3_next";
    f.config_class = "Qwen3NextConfig";
    f.summary = "Qwen3-Next hybrid (Gated DeltaNet with fused in_proj_qkvz / in_proj_ba + gated attention; sparse "
                "and dense layers, sigmoid-gated shared expert)";
    f.defaults.num_kv_heads = 2;
    f.defaults.head_dim = 256;
    f.defaults.partial_rotary_factor = 0.25;
    f.reads_attention_bias = true;
    f.moe = true;
    f.per_expert = PerExpertNames{"gate_proj", "up_proj", "down_proj", ""};
    f.read = [](const Reader& r, HfConfig& c) {
      read_qwen3_5_hybrid(r, c, 4);
      c.gdn.fused = true;
      read_qwen3_5_moe_keys(r, c, 512, 10, 512, 512);
      c.norm_topk_prob = r.boolean_or("norm_topk_prob", true);  // Qwen3NextTopKRouter renormalises only then
      // The dense layers' MLP (mlp_only_layers, or off decoder_sparse_step); Qwen3NextConfig's default.
      c.intermediate_size = r.has("intermediate_size") ? r.positive("intermediate_size") : 5632;
      read_sparse_layers(r, c);
    };
    f.presets = {{"tiny-qwen3-next", [](nlohmann::json& c) {
                    c.update({{"architectures", {"Qwen3NextForCausalLM"}}, {"model_type", "qwen3_next"}, {"head_dim", 16},
                              {"intermediate_size", 96}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false},
                              {"attention_bias", false}, {"layer_types", {"linear_attention", "full_attention"}},
                              {"linear_conv_kernel_dim", 4}, {"linear_key_head_dim", 16}, {"linear_value_head_dim", 16},
                              {"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"num_experts", 6},
                              {"num_experts_per_tok", 2}, {"norm_topk_prob", true}, {"moe_intermediate_size", 32},
                              {"shared_expert_intermediate_size", 48}, {"decoder_sparse_step", 1},
                              {"mlp_only_layers", nlohmann::json::array()}, {"router_aux_loss_coef", 0.001},
                              {"output_router_logits", false},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
