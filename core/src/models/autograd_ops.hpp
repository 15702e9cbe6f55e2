// Autograd adapters for the kernel ops. The ops expose explicit forward/backward methods (so backends can
// fuse and save what they like); model code wants ordinary differentiable tensors. Each function here is a
// torch::autograd::Function whose forward calls op.forward and whose backward calls op.backward with the
// same args and the op's own `saved`, so any backend — reference or plugin — trains without model changes.
//
// Only activations and LoRA factors (and MoE gates) are differentiable: base weights are frozen by design.
#pragma once
#include <memory>

#include <ATen/core/Tensor.h>

#include "axengine/ops/attention.hpp"
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_ce.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"

namespace ax::autograd {

// y = x·Wᵀ + bias + scaling·(x·Aᵀ)·Bᵀ. `args.x`, `args.lora_a`, `args.lora_b` may require grad.
at::Tensor linear_lora(const std::shared_ptr<ops::LinearLora>& op, ops::LinearLoraArgs args);

// RMSNorm over head_dim then RoPE. `args.x` and `args.weight` may require grad.
at::Tensor norm_rope(const std::shared_ptr<ops::NormRope>& op, ops::NormRopeArgs args);

// Varlen causal attention. q, k, v (and args.sinks, when defined) may require grad. Returns out [T, Hq, Dv].
at::Tensor attention(const std::shared_ptr<ops::Attention>& op, ops::AttentionArgs args);

// Grouped expert projection. x, lora_a, lora_b, gates may require grad.
at::Tensor moe_experts(const std::shared_ptr<ops::MoeExperts>& op, ops::MoeExpertsArgs args);

// The whole expert block (moe.mlp). x, gates and both projections' LoRA factors may require grad.
at::Tensor moe_mlp(const std::shared_ptr<ops::MoeMlp>& op, ops::MoeMlpArgs args);

// RMSNorm of x (+ residual). x, residual and weight may require grad. `sum` (x + residual, the residual
// stream) is defined only with a residual and is differentiable: gradients reaching it from later uses are
// passed to the op's backward as grad_sum.
struct RmsNormOutput {
  at::Tensor y, sum;
};
RmsNormOutput rms_norm(const std::shared_ptr<ops::RmsNorm>& op, ops::RmsNormArgs args);

// silu(gate) · up from gate and up, or from gate_up; whichever is given may require grad.
at::Tensor swiglu(const std::shared_ptr<ops::Swiglu>& op, ops::SwigluArgs args);

// Per-token cross-entropy of the LM head h · Wᵀ: fp32 [T], 0 at ignored targets. h may require grad (W is
// frozen). args.grad_in_forward is set here, whatever the caller passed: on exactly when grad mode is on and
// h requires grad (a backward is expected), so the backend may compute the gradient in the forward.
at::Tensor linear_ce(const std::shared_ptr<ops::LinearCe>& op, ops::LinearCeArgs args);

// The gated delta rule over packed sequences (args.cu_seqlens: each sample starts from its own state). q, k,
// v, g, beta and args.initial_state (when defined) may require grad. final_state is defined exactly when
// args.output_final_state and is differentiable (a gradient reaching it is the op's grad_final_state).
struct LinearAttentionOutput {
  at::Tensor out, final_state;
};
LinearAttentionOutput linear_attention(const std::shared_ptr<ops::LinearAttention>& op, ops::LinearAttentionArgs args);

// The depthwise causal conv1d + SiLU over packed sequences (the window restarts at each sample of
// args.cu_seqlens). x and args.initial_state may require grad; the weight is frozen (the op has no dweight).
// final_state as linear_attention's.
struct CausalConv1dOutput {
  at::Tensor y, final_state;
};
CausalConv1dOutput causal_conv1d(const std::shared_ptr<ops::CausalConv1d>& op, ops::CausalConv1dArgs args);

}  // namespace ax::autograd
