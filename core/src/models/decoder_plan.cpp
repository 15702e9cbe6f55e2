#include "models/decoder_plan.hpp"

#include <algorithm>

#include "axengine/kernel_op.hpp"
#include "axengine/strings.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/parts/gated_deltanet.hpp"
#include "models/parts/mla_layer.hpp"
#include "models/parts/shared_expert.hpp"

namespace ax::models {

std::string attention_layout(const HfConfig& c) { return c.attention_sinks ? "sinks" : ""; }

bool swiglu_mlp(const HfConfig& c) { return c.mlp_act != "gelu_pytorch_tanh"; }

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
  auto linear = [&](const std::string& weight) { out.push_back({"linear.lora", ops::to_string(formats.at(weight)), ""}); };
  // DecoderModel::layer: the input norm, attention, the post-attention norm (fused with the residual add),
  // then the MLP; gemma3_text's sandwich norms and olmoe's q/k norms over all heads are rms_norm calls too.
  out.push_back({"rms_norm", "", ""});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = str("model.layers.", i, ".");
    if (c.is_linear_layer(i)) {
      gated_deltanet_calls(c, p, formats, out);
    } else if (c.is_mla()) {
      mla_calls(c, p, formats, out);
    } else {
      for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) linear(p + "self_attn." + proj + ".weight");
      if (c.qk_norm) out.push_back({"norm_rope", "", ""});  // else plain RoPE in ATen
      out.push_back({"attention", "", attention_layout(c)});
    }
    if (c.is_moe_layer(i)) {  // the experts as one moe.mlp call; the router (either kind) is plain ATen
      // A backend must serve both projections' formats (skip_modules may keep one dense): both are asked for.
      for (const char* proj : {"gate_up_proj", "down_proj"})
        out.push_back({"moe.mlp", ops::to_string(formats.at(p + "mlp.experts." + proj)), "ENK"});
      if (c.shared_expert_intermediate_size > 0) shared_expert_calls(c, p, formats, out);
      continue;
    }
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) linear(p + "mlp." + proj + ".weight");
    if (swiglu_mlp(c)) out.push_back({"swiglu", "", ""});
  }
  // The head: logits through linear.lora; the loss alone through linear_ce where it applies. No family has a
  // head bias, and LoRA has no site on lm_head (lora_sites).
  linear("lm_head.weight");
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
