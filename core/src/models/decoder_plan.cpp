#include "models/decoder_plan.hpp"

#include <algorithm>

#include "axengine/kernel_op.hpp"
#include "axengine/strings.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/layer_parts.hpp"

namespace ax::models {

std::string attention_layout(const HfConfig& c) { return c.attention_sinks ? "sinks" : ""; }

bool fused_loss_applies(ops::WeightFormat lm_head_format, bool lm_head_lora, bool lm_head_bias) {
  return lm_head_format == ops::WeightFormat::dense && !lm_head_lora && !lm_head_bias;
}

std::vector<OpCall> ordered_calls(std::vector<OpCall> calls) {
  auto rank = [](const std::string& op) {
    const auto& ops = known_ops();
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (ops[i].id == op) return i;
    return ops.size();  // a plugin's op: after core's
  };
  std::sort(calls.begin(), calls.end(), [&](const OpCall& a, const OpCall& b) {
    const auto ra = rank(a.op), rb = rank(b.op);
    return ra != rb ? ra < rb : a < b;
  });
  calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
  return calls;
}

std::vector<OpCall> decoder_calls(const HfConfig& c, const std::map<std::string, ops::WeightFormat>& formats) {
  std::vector<OpCall> out;
  // Every layer's parts, each with the calls its forward makes (models/layer_parts.hpp).
  const auto layers = assemble_layers(c);
  for (std::size_t i = 0; i < layers.size(); ++i) layer_calls(c, layers[i], layer_prefix(static_cast<int64_t>(i)), formats, out);
  // The final norm and the head: logits through linear.lora; the loss alone through linear_ce where it applies.
  // No family has a head bias, and LoRA has no site on lm_head (lora_sites).
  out.push_back({"rms_norm", "", ""});
  out.push_back({"linear.lora", ops::to_string(formats.at("lm_head.weight")), ""});
  if (fused_loss_applies(formats.at("lm_head.weight"), false, false)) out.push_back({"linear_ce", "", ""});
  return ordered_calls(std::move(out));
}

std::string quantize_format(const HfConfig& c, const WeightPlan& plan) {
  // fp8 packs nothing at load: it keeps an FP8 checkpoint's bytes (decoder_checkpoint.cpp, fp8_kept_why).
  const bool packs = plan.format() != ops::WeightFormat::dense && plan.format() != ops::WeightFormat::fp8;
  return packs && !c.quant.present ? ops::to_string(plan.format()) : "";
}

DecoderPlan plan_decoder(const HfConfig& c, const safetensors::Checkpoint& ckpt, const WeightPolicy& policy) {
  check_checkpoint(c, ckpt);
  const WeightPlan plan = weight_plan(c, policy);
  return {decoder_calls(c, held_formats(c, plan, ckpt)), quantize_format(c, plan)};
}

}  // namespace ax::models
