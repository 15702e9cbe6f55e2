// glm4_moe (Glm4MoeForCausalLM, Glm4MoeConfig: GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7): llama-style attention with
// q/k/v biases (attention_bias; never on o_proj), optional per-head q/k RMSNorms (use_qk_norm) and partial RoPE
// (partial_rotary_factor, 0.5 by default, rotate-half on the first dims); the first first_k_dense_replace layers
// dense (a SiLU GLU of intermediate_size), the others sparse with MoeKind::group_topk_sigmoid (the group-limited
// sigmoid router of DeepSeek-V3, models/parts/group_topk_router.hpp) over SiLU-GLU experts of
// moe_intermediate_size, plus n_shared_experts shared experts (one ungated GLU, mlp.shared_experts.*). The loss has
// no aux loss. save_pretrained writes the experts per expert (mlp.experts.{e}.gate_proj...: transformers' qwen2_moe
// conversion reversed); the fused form loads too. The MTP layer GLM checkpoints append (model.layers.<N>.*) is not
// read, as transformers leaves it.
//
// LoRA targets as peft 0.21.2 names them on transformers 5.23's model: its MoE conversion (qwen2_moe's pattern) maps
// gate_proj + up_proj to the experts' fused gate_up_proj and down_proj to theirs, so those names select the routed
// experts only (not the dense layers' or the shared experts' MLPs).
#include <algorithm>
#include <cmath>

#include "models/config_reader.hpp"
#include "models/family.hpp"
#include "models/parts/group_topk_router.hpp"

namespace ax::models {

namespace {
int64_t positive_or(const Reader& r, const char* key, int64_t def) { return r.has(key) ? r.positive(key) : def; }
}  // namespace

void read_group_moe_keys(const Reader& r, HfConfig& c, const GroupMoeDefaults& d) {
  c.intermediate_size = positive_or(r, "intermediate_size", d.intermediate);
  c.moe_intermediate_size = positive_or(r, "moe_intermediate_size", d.moe_intermediate);
  c.num_experts = r.has("n_routed_experts") ? r.positive("n_routed_experts") : positive_or(r, "num_local_experts", d.experts);
  c.top_k = positive_or(r, "num_experts_per_tok", d.top_k);
  c.n_group = positive_or(r, "n_group", d.n_group);
  c.topk_group = positive_or(r, "topk_group", d.topk_group);
  c.norm_topk_prob = r.boolean_or("norm_topk_prob", true);
  c.routed_scaling_factor = r.number_or("routed_scaling_factor", d.scaling);
  if (!(c.routed_scaling_factor > 0) || !std::isfinite(c.routed_scaling_factor))
    throw r.bad("routed_scaling_factor", str("must be a finite number > 0, got ", c.routed_scaling_factor));
  check_group_topk(group_routing(c), c.num_experts, c.source);
  c.moe_kind = MoeKind::group_topk_sigmoid;
  // One GLU of n_shared_experts · moe_intermediate_size beside the routed experts, always on.
  const int64_t shared = positive_or(r, "n_shared_experts", 1);
  if (shared > 1024) throw r.bad("n_shared_experts", str("is ", shared, ", more than 1024"));
  c.shared_expert_intermediate_size = shared * c.moe_intermediate_size;
  c.shared_experts_ungated = true;
  const int64_t dense = r.integer_or("first_k_dense_replace", d.first_dense);
  if (dense < 0) throw r.bad("first_k_dense_replace", str("must be >= 0, got ", dense));
  for (int64_t i = 0; i < std::min(dense, c.num_layers); ++i) c.mlp_only_layers.push_back(i);
  // transformers' loss for these models has no aux loss, whatever router_aux_loss_coef / output_router_logits say
  // (output_router_logits only records the router logits): neither is read.
}

const Family& glm4_moe_family() {
  static const Family f = [] {
    Family f;
    f.name = "glm4_moe";
    f.config_class = "Glm4MoeConfig";
    f.summary = "GLM-4.5 MoE (group-limited sigmoid router, shared experts, dense first layers, partial RoPE)";
    f.defaults.rms_norm_eps = 1e-5;
    f.defaults.num_kv_heads = 8;
    f.defaults.partial_rotary_factor = 0.5;
    f.reads_attention_bias = true;
    f.moe = true;
    f.experts_key = "n_routed_experts";
    f.per_expert = PerExpertNames{"gate_proj", "up_proj", "down_proj", ""};
    f.read = [](const Reader& r, HfConfig& c) {
      c.o_bias = false;  // attention_bias sets q/k/v's; o_proj never has one
      c.qk_norm = r.boolean_or("use_qk_norm", false);
      const int64_t rot = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor);
      if (rot < 2 || rot % 2 != 0)
        throw r.bad("partial_rotary_factor", str(c.rope.partial_rotary_factor, " x head_dim ", c.head_dim,
                                                 " gives the rotary dim ", rot, " (it must be even and at least 2)"));
      c.rotary_dim = rot == c.head_dim ? 0 : rot;
      read_group_moe_keys(r, c, {10944, 1408, 128, 8, 1, 1, 1, 1.0});
    };
    f.presets = {{"tiny-glm4-moe", [](nlohmann::json& c) {
                    // GLM-4.5-Air's layout, tiny: q/k/v biases, partial RoPE 0.5, no q/k norm, layer 0 dense, 8
                    // experts in 2 groups (top-2 of the best group), one shared expert.
                    c.update({{"architectures", {"Glm4MoeForCausalLM"}}, {"model_type", "glm4_moe"}, {"head_dim", 16},
                              {"intermediate_size", 128}, {"moe_intermediate_size", 32}, {"n_routed_experts", 8},
                              {"num_experts_per_tok", 2}, {"n_group", 2}, {"topk_group", 1}, {"n_shared_experts", 1},
                              {"first_k_dense_replace", 1}, {"routed_scaling_factor", 1.0}, {"norm_topk_prob", true},
                              {"use_qk_norm", false}, {"attention_bias", true}, {"rms_norm_eps", 1e-5},
                              {"tie_word_embeddings", false},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.5}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
