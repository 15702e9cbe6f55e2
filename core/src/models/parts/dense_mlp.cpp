// The dense MLP of a decoder layer: down_proj(act(gate_proj(x)) · up_proj(x)), biases where the family's
// mlp_bias sets them. Two parts: SiLU through the swiglu op (every family but one), and gemma3_text's
// gelu_pytorch_tanh in plain ATen (there is no fused op for it).
#include <ATen/ATen.h>

#include "axengine/selection.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"
#include "models/layer_parts.hpp"

namespace ax::models {

namespace {

void dense_mlp_tensors(const HfConfig& c, const std::string& prefix, TensorShapes& out) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string p = prefix + "mlp.";
  out.push_back({p + "gate_proj.weight", {I, H}});
  out.push_back({p + "up_proj.weight", {I, H}});
  out.push_back({p + "down_proj.weight", {H, I}});
  if (c.mlp_bias) {
    out.push_back({p + "gate_proj.bias", {I}});
    out.push_back({p + "up_proj.bias", {I}});
    out.push_back({p + "down_proj.bias", {H}});
  }
}

void dense_mlp_lora_sites(const HfConfig& c, const std::string& prefix, std::vector<LoraSite>& out) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string p = prefix + "mlp.";
  out.push_back(LoraSite{p + "gate_proj", "gate_proj", false, 1, H, I});
  out.push_back(LoraSite{p + "up_proj", "up_proj", false, 1, H, I});
  out.push_back(LoraSite{p + "down_proj", "down_proj", false, 1, I, H});
}

void projection_calls(const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out) {
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
    out.push_back({"linear.lora", ops::to_string(formats.at(prefix + "mlp." + proj + ".weight")), ""});
}

void swiglu_mlp_calls(const HfConfig&, const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out) {
  projection_calls(prefix, formats, out);
  out.push_back({"swiglu", "", ""});
}

void gelu_mlp_calls(const HfConfig&, const std::string& prefix, const HeldFormats& formats, std::vector<OpCall>& out) {
  projection_calls(prefix, formats, out);
}

}  // namespace

at::Tensor DecoderModel::swiglu_mlp(int64_t i, const at::Tensor& x, std::vector<at::Tensor>&) {
  const std::string p = layer_prefix(i) + "mlp.";
  ops::SwigluArgs a;
  a.gate = linear(x, p + "gate_proj");
  a.up = linear(x, p + "up_proj");
  at::Tensor act = autograd::swiglu(kernels_->get<ops::Swiglu>(ops::dtype_name(dtype_)), std::move(a));
  return linear(act, p + "down_proj");
}

at::Tensor DecoderModel::gelu_mlp(int64_t i, const at::Tensor& x, std::vector<at::Tensor>&) {
  const std::string p = layer_prefix(i) + "mlp.";
  return linear(at::gelu(linear(x, p + "gate_proj"), "tanh") * linear(x, p + "up_proj"), p + "down_proj");
}

const FfnPart& Parts::swiglu_mlp() {
  static const FfnPart p{{"swiglu_mlp", dense_mlp_tensors, dense_mlp_lora_sites, swiglu_mlp_calls}, &DecoderModel::swiglu_mlp, false};
  return p;
}

const FfnPart& Parts::gelu_mlp() {
  static const FfnPart p{{"gelu_mlp", dense_mlp_tensors, dense_mlp_lora_sites, gelu_mlp_calls}, &DecoderModel::gelu_mlp, false};
  return p;
}

}  // namespace ax::models
