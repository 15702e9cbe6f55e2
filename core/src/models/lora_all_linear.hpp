// peft's target_modules = "all-linear" (peft 0.21.2, INCLUDE_LINEAR_LAYERS_SHORTHAND), resolved per family as
// peft resolves it on the transformers 5 model: _maybe_include_all_linear_layers takes every nn.Linear but the
// output embeddings (lm_head); on the MoE families transformers 5 fuses (the family's PerExpertNames: qwen3_moe,
// olmoe, mixtral) convert_peft_config_for_transformers then adds what was an nn.Linear in transformers 4, by its
// old name: the experts (gate+up → the fused gate_up_proj at rank 2r and alpha 2·alpha, down → down_proj) and the
// router (`gate` → target_parameters gate.weight), and those names leave target_modules, so the dense MLP
// layers of such a model get none. gpt_oss's experts and router never were nn.Linear: attention only (its experts
// take LoRA when named: peft's target_parameters, which all-linear does not set).
// tests/data/models/all_linear.json (scripts/goldens/make_all_linear_goldens.py) holds what peft made.
#pragma once
#include <string>
#include <vector>

#include "models/lora.hpp"

namespace ax::models {

inline constexpr const char* kAllLinear = "all-linear";

struct AllLinear {
  std::vector<std::string> targets;  // the target names it stands for, as plan_lora takes them
  // What peft also targets and axengine has no LoRA site for: the routers' weights ("model.layers.0.mlp.gate.weight"),
  // or a multimodal model's vision tower ("visual"). Non-empty: plan_lora refuses "all-linear", naming them.
  std::vector<std::string> not_supported;
};

// True when `targets` is the shorthand (peft compares it lower-cased).
bool is_all_linear(const std::vector<std::string>& targets);
AllLinear resolve_all_linear(const std::string& model_type, const std::vector<LoraSite>& sites);

}  // namespace ax::models
