#include "axengine/kernel_op.hpp"

namespace ax {

const std::vector<OpInfo>& known_ops() {
  // Contracts: docs/ops/<id>.md. The config key is what [kernels] uses.
  static const std::vector<OpInfo> ops = {
      {"moe.experts", "moe", "grouped expert projection with optional LoRA (MoE expert layers)"},
      {"dequant", "dequant", "nf4 / mxfp4 / nvfp4 weights to bf16/fp16/fp32, optionally per selected expert"},
      {"norm_rope", "norm_rope", "RMSNorm (w or 1+w) followed by rotary embedding"},
      {"attention", "attention", "causal GQA attention over packed variable-length sequences"},
      {"linear.lora", "linear_lora", "y = x W^T + s (x A^T) B^T with W dense or packed (nf4, mxfp4, nvfp4)"},
      {"rms_norm", "rms_norm", "RMSNorm (w or 1+w), optionally fused with the residual add before it"},
      {"swiglu", "swiglu", "silu(gate) * up, from two tensors or one [*, 2I] gate_up"},
      {"linear_ce", "linear_ce", "LM head and per-token cross-entropy without materialising the logits"},
      {"moe.mlp", "moe_mlp", "whole MoE expert block: gate_up, GLU, down, gated combine, LoRA on both projections"},
      {"linear_attention", "linear_attention", "gated delta rule (Gated DeltaNet) over packed sequences, fp32 state"},
      {"causal_conv1d", "causal_conv1d", "depthwise causal conv1d + SiLU over packed sequences, with a decode state"},
  };
  return ops;
}

const OpInfo* find_op(const std::string& key) {
  for (const auto& op : known_ops())
    if (op.id == key || op.config_key == key) return &op;
  return nullptr;
}

}  // namespace ax
