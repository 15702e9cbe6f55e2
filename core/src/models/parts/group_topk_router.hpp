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

struct GroupTopkRouting {
  int64_t n_group = 1, topk_group = 1, top_k = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
};

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
