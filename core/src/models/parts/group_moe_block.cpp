// The sparse MLP of deepseek_v3 and glm4_moe (MoeKind::group_topk_sigmoid): the group-limited sigmoid router
// (group_topk_router.hpp) chooses each token's experts and weights; the experts run as every family's do, one
// moe.mlp call (DecoderModel::expert_mlp); the shared experts are added by DecoderModel::layer.
#include <ATen/ATen.h>

#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/parts/group_topk_router.hpp"

namespace ax::models {

at::Tensor DecoderModel::group_moe_block(int64_t i, const at::Tensor& x) {
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

}  // namespace ax::models
