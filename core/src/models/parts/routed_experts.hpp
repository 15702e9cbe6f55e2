// The routed experts every MoE part runs (parts/moe_block.cpp, gpt_oss_moe.cpp, parts/group_moe_block.cpp): the
// fused mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I] as one moe.mlp call (DecoderModel::expert_mlp,
// moe_mlp_block.cpp). Their LoRA sites and calls are the same for every router in front of them.
#pragma once
#include <string>
#include <vector>

#include "models/layer_parts.hpp"

namespace ax::models {

// gate_up_proj and down_proj under `prefix` + "mlp.experts.", ENK.
void routed_experts_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out);
// Every family's fused experts, gpt_oss's too (its checkpoint's [E, in, out] matrices are held ENK: the sites'
// in/out are the same; peft's target_parameters LoRA, docs/models.md "gpt_oss expert LoRA").
void routed_experts_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out);
// One moe.mlp call; a backend must serve both projections' formats (skip_modules may keep one dense): both are
// asked for. The router (any kind) is plain ATen.
void routed_experts_calls(const HfConfig& c, const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out);

}  // namespace ax::models
