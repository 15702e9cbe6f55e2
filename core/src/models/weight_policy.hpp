// Which frozen base weights a WeightPolicy packes, and how (docs/weights.md): the projections of attention,
// MLP and MoE experts go into policy.format; everything else (embeddings, lm_head, routers, norms, biases)
// and the projections named by skip_modules stay in the compute dtype.
#pragma once
#include <string>
#include <vector>

#include "axengine/model.hpp"
#include "axengine/ops/quantizer.hpp"

namespace ax::models {

// A frozen projection: q/k/v/o_proj.weight, gate/up/down_proj.weight, mlp.experts.gate_up_proj / down_proj, or
// lm_head.weight (held as a WeightTensor, but never packed: the policy keeps it in the compute dtype).
bool is_projection(const std::string& tensor_name);
// The module path a tensor belongs to: "...q_proj.weight" -> "...q_proj"; fused experts keep their
// parameter path ("...mlp.experts.gate_up_proj").
std::string module_path(const std::string& tensor_name);

// `entry` names `path` when it is a run of whole dotted segments of it: "o_proj", "self_attn.o_proj",
// "experts", "layers.0" and the full path all name "model.layers.0.self_attn.o_proj".
bool skip_entry_matches(const std::string& path, const std::string& entry);

class WeightPlan {
 public:
  // Throws UsageError for an unknown format, and for a skip_modules entry that names no module of
  // `module_paths` (with the closest module name).
  WeightPlan(WeightPolicy policy, const std::vector<std::string>& module_paths);

  ops::WeightFormat format() const { return format_; }
  const WeightPolicy& policy() const { return policy_; }
  // The spec to pack this tensor with, or why it stays in the compute dtype ("lm_head", "skip_modules 'x'",
  // "4 elements are not a multiple of blocksize 64"); `why` is empty when it is packed.
  ops::QuantizeSpec spec_for(const std::string& tensor_name, const std::vector<int64_t>& shape, std::string& why) const;

 private:
  WeightPolicy policy_;
  ops::WeightFormat format_ = ops::WeightFormat::dense;
};

}  // namespace ax::models
