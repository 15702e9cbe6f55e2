// The shared expert of Qwen3.5-MoE and Qwen3-Next's sparse MLP: a SiLU GLU of shared_expert_intermediate_size under
// mlp.shared_expert., times sigmoid(mlp.shared_expert_gate(x)) (a [1, hidden] projection), added to the routed
// experts' output. DeepSeek-V3 and GLM-4.5's (HfConfig::shared_experts_ungated): the GLU under mlp.shared_experts.,
// no gate. The layer part Parts::shared_expert() (models/layer_parts.hpp); its forward is DecoderModel::shared_expert.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "axengine/model_check.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/hf_config.hpp"
#include "models/lora.hpp"

namespace ax::models {

void shared_expert_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out);
// gate_proj, up_proj, down_proj (peft's names) and shared_expert_gate (gated only).
void shared_expert_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out);
void shared_expert_calls(const HfConfig& c, const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
                         std::vector<OpCall>& out);

}  // namespace ax::models
