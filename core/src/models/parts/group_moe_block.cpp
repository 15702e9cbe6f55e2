// The sparse MLP of deepseek_v3 and glm4_moe (MoeKind::group_topk_sigmoid): the group-limited sigmoid router
// (group_topk_router.hpp) chooses each token's experts and weights; the experts run as every family's do, one
// moe.mlp call (parts/routed_experts.hpp); the layer adds the shared experts (Parts::shared_expert) beside it.
#include <ATen/ATen.h>

#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/parts/group_topk_router.hpp"
#include "models/parts/routed_experts.hpp"

namespace ax::models {

namespace {
// The router's weight and its fp32 correction bias, then the experts.
void moe_group_topk_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  out.push_back({prefix + "mlp.gate.weight", {c.num_experts, c.hidden_size}});
  out.push_back({prefix + "mlp.gate.e_score_correction_bias", {c.num_experts}});
  routed_experts_tensors(c, prefix, out);
}
}  // namespace

at::Tensor DecoderModel::group_moe_block(int64_t i, const at::Tensor& x, std::vector<at::Tensor>&) {  // no aux loss
  const std::string p = str("model.layers.", i, ".mlp.");
  // The correction bias is held in fp32, as transformers keeps it (_keep_in_fp32_modules_strict).
  const GroupTopkChoice choice = group_topk_route(x, w(p + "gate.weight"), weights_.at(p + "gate.e_score_correction_bias"),
                                                  group_routing(cfg_));
  ops::MoeMlpArgs a;
  a.x = x;
  a.routing = moe_routing(choice.indices);
  a.gates = choice.weights.to(x.scalar_type());
  a.activation = ops::MoeActivation::silu_glu;  // gate in the first I columns of gate_up_proj, up in the last I
  a.packing = ops::GluPacking::halves;
  return expert_mlp(std::move(a), p + "experts.");  // [T, H]
}

const FfnPart& Parts::moe_group_topk() {
  static const FfnPart p{{"moe_group_topk", moe_group_topk_tensors, routed_experts_lora_sites, routed_experts_calls},
                         &DecoderModel::group_moe_block,
                         true};
  return p;
}

}  // namespace ax::models
