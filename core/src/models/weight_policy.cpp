#include "models/weight_policy.hpp"

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

bool is_projection(const std::string& n) {
  if (n == "lm_head.weight") return true;
  for (const char* leaf : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight", ".mlp.gate_proj.weight",
                           ".mlp.up_proj.weight", ".mlp.down_proj.weight", ".mlp.experts.gate_up_proj", ".mlp.experts.down_proj",
                           // Gated DeltaNet (models/parts/gated_deltanet.hpp)
                           ".linear_attn.in_proj_qkv.weight", ".linear_attn.in_proj_z.weight", ".linear_attn.in_proj_b.weight",
                           ".linear_attn.in_proj_a.weight", ".linear_attn.out_proj.weight",
                           ".linear_attn.in_proj_qkvz.weight", ".linear_attn.in_proj_ba.weight",  // Qwen3-Next's fused ones
                           // the shared expert (models/parts/shared_expert.hpp)
                           ".mlp.shared_expert.gate_proj.weight", ".mlp.shared_expert.up_proj.weight",
                           ".mlp.shared_expert.down_proj.weight", ".mlp.shared_expert_gate.weight",
                           // DeepSeek-V3 / GLM-4.5's shared experts, and multi-head latent attention (models/parts/mla_layer.hpp)
                           ".mlp.shared_experts.gate_proj.weight", ".mlp.shared_experts.up_proj.weight",
                           ".mlp.shared_experts.down_proj.weight", ".self_attn.q_a_proj.weight", ".self_attn.q_b_proj.weight",
                           ".self_attn.kv_a_proj_with_mqa.weight", ".self_attn.kv_b_proj.weight"})
    if (ends_with(n, leaf)) return true;
  return false;
}

std::string module_path(const std::string& n) { return ends_with(n, ".weight") ? n.substr(0, n.size() - 7) : n; }

bool skip_entry_matches(const std::string& path, const std::string& entry) {
  if (entry.empty()) return false;
  const std::string p = "." + path + ".", e = "." + entry + ".";
  return p.find(e) != std::string::npos;
}

WeightPlan::WeightPlan(WeightPolicy policy, const std::vector<std::string>& module_paths) : policy_(std::move(policy)) {
  auto f = ops::parse_weight_format(policy_.format);
  if (!f) throw UsageError(str("model.weight_format '", policy_.format, "' is not one of dense, nf4, mxfp4, nvfp4, fp8"));
  format_ = *f;
  for (const auto& entry : policy_.skip_modules) {
    bool hit = false;
    for (const auto& m : module_paths) hit = hit || skip_entry_matches(m, entry);
    if (!hit) {
      std::vector<std::string> leaves;
      for (const auto& m : module_paths) leaves.push_back(m.substr(m.rfind('.') + 1));
      std::string hint = closest(entry, leaves);
      throw UsageError(str("model.skip_modules: '", entry, "' names no module of this model",
                           hint.empty() ? std::string() : str(" (did you mean '", hint, "'?)")));
    }
  }
}

ops::QuantizeSpec WeightPlan::spec_for(const std::string& name, const std::vector<int64_t>& shape, std::string& why) const {
  ops::QuantizeSpec s;
  s.format = format_;
  s.blocksize = policy_.blocksize;
  s.double_quant = policy_.double_quant;
  s.axis = -1;                                     // K: [N, K] linears and [E, N, K] experts alike
  s.per_expert_scale = shape.size() == 3;          // nvfp4 experts: one global scale per expert
  why.clear();
  if (format_ == ops::WeightFormat::dense) why = "weight_format dense";
  else if (format_ == ops::WeightFormat::fp8) why = "not stored in FP8 in the checkpoint";  // fp8 only keeps, never packs
  else if (!is_projection(name)) why = "not a projection";
  else if (name == "lm_head.weight") why = "lm_head stays in the compute dtype";
  else {
    const std::string path = module_path(name);
    for (const auto& entry : policy_.skip_modules)
      if (skip_entry_matches(path, entry)) {
        why = str("skip_modules '", entry, "'");
        break;
      }
    if (why.empty()) why = ops::quantize_misfit(shape, s);
    // moe.experts dequantises per expert: an nf4 block must not straddle two experts.
    if (why.empty() && format_ == ops::WeightFormat::nf4 && shape.size() == 3 && (shape[1] * shape[2]) % s.blocksize != 0)
      why = str("an expert's ", shape[1] * shape[2], " elements are not a multiple of blocksize ", s.blocksize);
  }
  return s;
}

}  // namespace ax::models
