// DecoderModel's base weights with the LoRA deltas folded in, as HF save_pretrained writes the checkpoint
// (merge-lora, the full-model export of unfrozen parameters: write_model_dir).
#include <ATen/ATen.h>

#include "axengine/ops/quant.hpp"
#include "models/decoder.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/gpt_oss.hpp"

namespace ax::models {
namespace {

// qwen3_vl_moe's fused experts (models/decoder_checkpoint.hpp) as the hub's checkpoints hold them: gate_up_proj
// [E, H, 2I], down_proj [E, I, H] (what vLLM reads too). transformers tells that layout from its module's
// [E, 2I, H] / [E, H, I] by the shape; where the two are the same shape (2I = H, I = H) it reads the tensor as its
// module's, and so does our load: written so there.
at::Tensor fused_experts_as_hub(const at::Tensor& t) {
  return (t.size(1) == t.size(2) ? t : t.transpose(1, 2)).contiguous();
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> DecoderModel::merged_state_dict(at::ScalarType dtype) const {
  std::map<std::string, at::Tensor> merged;
  for (const auto& [n, t] : weights_) merged[n] = t.detach().to(at::kFloat);
  for (const auto& [n, wt] : frozen_)  // a packed base is dequantised: the merged model is dense
    merged[n] = wt.is_dense() ? wt.values.detach().to(at::kFloat) : ops::dequantize(wt, at::kFloat);
  for (const auto& m : lora_.modules) {
    std::string key = m.site.experts ? m.site.path : m.site.path + ".weight";
    merged[key] = merged.at(key) + lora_delta(m).to(merged[key].device());
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, shape] : internal_tensors(cfg_)) {
    bool router = name.size() > 15 && name.compare(name.size() - 15, 15, "mlp.gate.weight") == 0;
    bool experts = name.find("mlp.experts.") != std::string::npos;
    const at::Tensor& t = merged.at(name);
    if (keeps_fp32(name)) {  // saved in fp32 whatever the dtype, as transformers saves it
      out.emplace_back(name, t.to(at::kFloat).contiguous());
      continue;
    }
    if (cfg_.moe_kind == MoeKind::topk_softmax_clamped) {
      out.emplace_back(name, gpt_oss_to_checkpoint(name, t.to(dtype)).contiguous());
      continue;
    }
    if (!router && !experts) {
      out.emplace_back(name, t.to(dtype).contiguous());
      continue;
    }
    if (experts && experts_maybe_transposed(cfg_)) {  // qwen3_vl_moe: its class reads the fused experts only
      out.emplace_back(name, fused_experts_as_hub(t.to(dtype)));
      continue;
    }
    std::string p = name.substr(0, name.find("mlp."));
    ExpertKeys k = expert_keys(cfg_, p, true);
    const int64_t E = cfg_.num_experts, I = cfg_.moe_intermediate_size;
    if (router) out.emplace_back(k.router, t.to(dtype).contiguous());
    else if (name.find("gate_up_proj") != std::string::npos)
      for (int64_t e = 0; e < E; ++e) {
        out.emplace_back(with_expert(k.gate, e), t[e].narrow(0, 0, I).to(dtype).contiguous());
        out.emplace_back(with_expert(k.up, e), t[e].narrow(0, I, I).to(dtype).contiguous());
      }
    else
      for (int64_t e = 0; e < E; ++e) out.emplace_back(with_expert(k.down, e), t[e].to(dtype).contiguous());
  }
  return out;
}

}  // namespace ax::models
