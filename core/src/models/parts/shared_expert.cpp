#include "models/parts/shared_expert.hpp"

#include <ATen/ATen.h>

#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"

namespace ax::models {

namespace {
// The GLU's module: mlp.shared_expert. (Qwen, gated) or mlp.shared_experts. (DeepSeek-V3, GLM-4.5, ungated).
std::string glu_module(const HfConfig& c, const std::string& prefix) {
  return prefix + (c.shared_experts_ungated ? "mlp.shared_experts." : "mlp.shared_expert.");
}
}  // namespace

void shared_expert_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const int64_t H = c.hidden_size, I = c.shared_expert_intermediate_size;
  const std::string p = glu_module(c, prefix);
  out.push_back({p + "gate_proj.weight", {I, H}});
  out.push_back({p + "up_proj.weight", {I, H}});
  out.push_back({p + "down_proj.weight", {H, I}});
  if (!c.shared_experts_ungated) out.push_back({prefix + "mlp.shared_expert_gate.weight", {1, H}});
}

void shared_expert_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  const int64_t H = c.hidden_size, I = c.shared_expert_intermediate_size;
  const std::string p = glu_module(c, prefix);
  out.push_back(LoraSite{p + "gate_proj", "gate_proj", false, 1, H, I});
  out.push_back(LoraSite{p + "up_proj", "up_proj", false, 1, H, I});
  out.push_back(LoraSite{p + "down_proj", "down_proj", false, 1, I, H});
  if (!c.shared_experts_ungated) out.push_back(LoraSite{prefix + "mlp.shared_expert_gate", "shared_expert_gate", false, 1, H, 1});
}

void shared_expert_calls(const HfConfig& c, const std::string& prefix, const std::map<std::string, ops::WeightFormat>& formats,
                         std::vector<OpCall>& out) {
  std::vector<std::string> weights;
  for (const char* w : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) weights.push_back(glu_module(c, prefix) + w);
  if (!c.shared_experts_ungated) weights.push_back(prefix + "mlp.shared_expert_gate.weight");
  for (const auto& w : weights) out.push_back({"linear.lora", ops::to_string(formats.at(w)), ""});
  out.push_back({"swiglu", "", ""});
}

at::Tensor DecoderModel::shared_expert(int64_t i, const at::Tensor& x, std::vector<at::Tensor>&) {
  const std::string p = glu_module(cfg_, str("model.layers.", i, "."));
  ops::SwigluArgs a;
  a.gate = linear(x, p + "gate_proj");
  a.up = linear(x, p + "up_proj");
  at::Tensor y = linear(autograd::swiglu(kernels_->get<ops::Swiglu>(ops::dtype_name(dtype_)), std::move(a)), p + "down_proj");
  if (cfg_.shared_experts_ungated) return y;
  // transformers: sigmoid(shared_expert_gate(x)) · shared_expert(x), in the compute dtype.
  return at::sigmoid(linear(x, str("model.layers.", i, ".mlp.shared_expert_gate"))) * y;
}

const FfnPart& Parts::shared_expert() {
  static const FfnPart p{{"shared_expert", shared_expert_tensors, shared_expert_lora_sites, shared_expert_calls},
                         &DecoderModel::shared_expert,
                         false};
  return p;
}

}  // namespace ax::models
