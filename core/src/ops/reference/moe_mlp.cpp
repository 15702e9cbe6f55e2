// Reference moe.mlp: the block composed from the reference moe.experts (two grouped projections, fp32 math,
// each output rounded once to the compute dtype) with the activation between them in fp32 (moe_glu). Not
// the registry's moe.experts choice: the reference must not change with the loaded plugins, it is the
// conformance suite's ground truth.
#include <memory>

#include "axengine/ops/moe_mlp.hpp"

namespace ax::ops {

std::shared_ptr<MoeExperts> make_reference_moe_experts();

std::shared_ptr<MoeMlp> make_reference_moe_mlp() { return compose_moe_mlp(make_reference_moe_experts()); }

}  // namespace ax::ops
