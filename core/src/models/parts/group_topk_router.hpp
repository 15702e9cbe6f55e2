// The group-limited sigmoid router of DeepSeek-V3 and GLM-4.5 (their configs' topk_method "noaux_tc"):
// transformers' DeepseekV3TopkRouter / Glm4MoeTopkRouter, step for step.
//
//   logits = x · Wᵀ (fp32)        s = sigmoid(logits)          c = s + b   (b: e_score_correction_bias)
//   groups: the E experts in n_group contiguous groups; a group's score is the sum of its best two c;
//   only the topk_group best groups stay; of their experts the top_k by c are chosen;
//   weights = s of the chosen (not c: the bias steers the choice only), divided by their sum (+1e-20) when
//   norm_topk_prob, times routed_scaling_factor.
//
// The bias is a buffer the checkpoint holds, never trained: no gradient reaches it (the choice is not
// differentiable anyway); gradients flow to x and W through the chosen s.
#pragma once
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace ax::models {

struct HfConfig;

struct GroupTopkRouting {
  int64_t n_group = 1, topk_group = 1, top_k = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
};
// The routing of a MoeKind::group_topk_sigmoid config (parts/group_moe_block.cpp).
GroupTopkRouting group_routing(const HfConfig& c);

// The MoE keys Glm4MoeConfig and DeepseekV3Config share, with the class's defaults (families/glm4_moe.cpp): the
// dense layers' intermediate_size, the routed experts (n_routed_experts, or num_local_experts: the classes' alias),
// top-k, n_group / topk_group (checked by check_group_topk), norm_topk_prob, routed_scaling_factor, the shared
// experts (n_shared_experts) and the dense first layers (first_k_dense_replace).
struct Reader;
struct GroupMoeDefaults {
  int64_t intermediate, moe_intermediate, experts, top_k, n_group, topk_group, first_dense;
  double scaling;
};
void read_group_moe_keys(const Reader& r, HfConfig& c, const GroupMoeDefaults& d);

// Throws UsageError naming `source` and the config key when the settings cannot route num_experts experts:
// n_routed_experts not divisible by n_group, fewer than 2 experts per group (a group scores its best two),
// topk_group outside [1, n_group], num_experts_per_tok outside [1, experts in the kept groups].
void check_group_topk(const GroupTopkRouting& r, int64_t num_experts, const std::string& source);

struct GroupTopkChoice {
  at::Tensor logits;   // [T, E] fp32
  at::Tensor indices;  // [T, top_k] int64, in no particular order within a row
  at::Tensor weights;  // [T, top_k] fp32, matching indices
};

// x [T, H] (any float dtype), weight [E, H], correction_bias [E] (fp32; undefined = zeros).
GroupTopkChoice group_topk_route(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& correction_bias,
                                 const GroupTopkRouting& r);

}  // namespace ax::models
