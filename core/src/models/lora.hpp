// LoRA adapters of a decoder model: which modules get one, their tensors, and PEFT's on-disk format.
//
// Internal layout (what the kernel ops take):
//   linear module:  a [r, K], b [N, r]
//   fused experts:  a [r·E, K] (A_e = rows e·r..), b [N, r·E] (B_e = columns e·r..)   (moe.experts op)
// PEFT's ParamWrapper (transformers 5 fused experts) stores lora_A [r·E, K] the same way but lora_B with
// column index j·E + e; save/load convert.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "axengine/model.hpp"

namespace ax::models {

// One LoRA-able place in the model.
struct LoraSite {
  std::string path;      // HF (transformers 5) module path: model.layers.3.self_attn.q_proj, model.layers.0.mlp.experts.gate_up_proj
  std::string leaf;      // q_proj ... down_proj, or gate_up_proj / down_proj for experts
  bool experts = false;  // a fused [E, N, K] expert parameter
  int64_t num_experts = 1;
  int64_t in_features = 0, out_features = 0;  // K, N
  // The module's path in peft's model where it differs from `path` (qwen2_5_vl's language model sits under
  // model.language_model. in transformers 5); empty: `path`. Adapter keys use it; loading also accepts `path`.
  std::string peft_path;
};

struct LoraModule {
  LoraSite site;
  int64_t r = 0;
  double alpha = 0;
  double scaling = 0;
  at::Tensor a, b;  // internal layout, leaves with requires_grad
  std::string peft_key;  // key prefix in adapter_model.safetensors, without ".lora_A.weight"
};

struct LoraSet {
  LoraSpec spec;
  std::string model_type;  // for the MoE name mapping
  // The base model's directory (absolute), written as adapter_config.json's base_model_name_or_path so that
  // peft's AutoPeftModelForCausalLM finds the base; empty: written as null.
  std::string base_model;
  std::vector<LoraModule> modules;
  // peft's modules_to_save: whole base modules trained beside the adapter, saved in full. The module paths,
  // and their tensors by HF name (model.layers.0.input_layernorm.weight, lm_head.weight).
  std::vector<std::string> modules_to_save;
  std::map<std::string, at::Tensor> saved;
  const LoraModule* find(const std::string& path) const;
};

// The sites a spec selects, with each one's rank and alpha (peft's MoE conversion doubles both for a fused
// gate_up_proj targeted as gate_proj + up_proj). Throws UsageError naming a target that matches nothing.
struct LoraPlan {
  LoraSite site;
  int64_t r;
  double alpha;
};
std::vector<LoraPlan> plan_lora(const LoraSpec& spec, const std::string& model_type, const std::vector<LoraSite>& sites);

// Fresh adapter: A kaiming-uniform(a=√5) as nn.Linear / peft, B zeros. Tensors on `device`, `dtype`.
LoraSet make_lora(const LoraSpec& spec, const std::string& model_type, const std::vector<LoraSite>& sites,
                  at::ScalarType dtype, at::Device device);

// PEFT adapter I/O. load validates config fields we do not implement (DoRA, bias, fan_in_fan_out, ...)
// and every tensor's shape, naming the file and key. modules_to_save are written and read as peft does: the
// module paths in adapter_config.json, each tensor under base_model.model.<HF name> (load takes a tensor of a
// module that a modules_to_save entry names, as peft matches it: the path or a dotted suffix of it; the model
// checks names and shapes when it applies them, DecoderModel::restore_saved).
void save_peft(const LoraSet& lora, const std::string& dir);
LoraSet load_peft(const std::string& dir, const std::string& model_type, const std::vector<LoraSite>& sites,
                  at::ScalarType compute_dtype, at::Device device);

// The delta a LoRA module adds to its base weight, in the base weight's layout ([N, K] or [E, N, K]).
at::Tensor lora_delta(const LoraModule& m);

}  // namespace ax::models
