#include "models/parts/shared_expert.hpp"

#include <ATen/ATen.h>

#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"

namespace ax::models {

void shared_expert_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const int64_t H = c.hidden_size, I = c.shared_expert_intermediate_size;
  const std::string p = prefix + "mlp.shared_expert.";
  out.push_back({p + "gate_proj.weight", {I, H}});
  out.push_back({p + "up_proj.weight", {I, H}});
  out.push_back({p + "down_proj.weight", {H, I}});
  out.push_back({prefix + "mlp.shared_expert_gate.weight", {1, H}});
}

void shared_expert_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  const int64_t H = c.hidden_size, I = c.shared_expert_intermediate_size;
  const std::string p = prefix + "mlp.shared_expert.";
  out.push_back(LoraSite{p + "gate_proj", "gate_proj", false, 1, H, I});
  out.push_back(LoraSite{p + "up_proj", "up_proj", false, 1, H, I});
  out.push_back(LoraSite{p + "down_proj", "down_proj", false, 1, I, H});
  out.push_back(LoraSite{prefix + "mlp.shared_expert_gate", "shared_expert_gate", false, 1, H, 1});
}

void shared_expert_calls(const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
                         std::vector<OpCall>& out) {
  for (const char* w : {"mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
                        "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight"})
    out.push_back({"linear.lora", ops::to_string(formats.at(prefix + w)), ""});
  out.push_back({"swiglu", "", ""});
}

at::Tensor DecoderModel::shared_expert(int64_t i, const at::Tensor& x) {
  const std::string p = str("model.layers.", i, ".mlp.");
  ops::SwigluArgs a;
  a.gate = linear(x, p + "shared_expert.gate_proj");
  a.up = linear(x, p + "shared_expert.up_proj");
  at::Tensor y = linear(autograd::swiglu(kernels_->get<ops::Swiglu>(ops::dtype_name(dtype_)), std::move(a)), p + "shared_expert.down_proj");
  // transformers: sigmoid(shared_expert_gate(x)) · shared_expert(x), in the compute dtype.
  return at::sigmoid(linear(x, p + "shared_expert_gate")) * y;
}

}  // namespace ax::models
