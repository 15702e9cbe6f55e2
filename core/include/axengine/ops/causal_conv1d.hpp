// causal_conv1d — the short depthwise causal convolution with SiLU that Gated DeltaNet layers (Qwen3-Next,
// Qwen3.5) run over their q/k/v projections, over packed variable-length sequences.
// Contract: docs/ops/causal_conv1d.md.
//
// Sequence b owns rows [cu_seqlens[b], cu_seqlens[b+1]); its window never reaches into another sequence.
// For row p of a sequence (0-based), channel c, kernel width W:
//   y[p, c] = silu( Σ_{j=0}^{W-1} weight[c, W-1-j] · x[p-j, c] )
// where x[p-j] for p-j < 0 is row W-1+(p-j) of initial_state[b] (the W-1 inputs before the sequence,
// oldest first), or zero without one. final_state[b] holds the sequence's last W-1 inputs, in the same
// layout, so a decode step continues where the prefill stopped.
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct CausalConv1dArgs {
  at::Tensor x;       // [T, C] (packed rows, channels last)
  at::Tensor weight;  // [C, W], x's dtype (transformers' conv1d.weight [C, 1, W] squeezed)
  at::Tensor cu_seqlens;     // int32 [N+1], cu_seqlens[0] == 0, nondecreasing, cu_seqlens[N] == T
  at::Tensor initial_state;  // optional [N, W-1, C], x's dtype
  bool output_final_state = false;
  at::Tensor out;            // optional preallocated output [T, C]
  bool check_values = true;  // check cu_seqlens contents on the host (a device sync)
};

struct CausalConv1dResult {
  at::Tensor y;            // [T, C], x's dtype
  at::Tensor final_state;  // [N, W-1, C], x's dtype, when output_final_state
};

struct CausalConv1dGrads {
  at::Tensor dx;              // like x
  at::Tensor dinitial_state;  // like initial_state; defined exactly when initial_state is
};

struct CausalConv1dBackwardArgs {
  at::Tensor grad_y;            // [T, C]
  at::Tensor grad_final_state;  // optional [N, W-1, C]; only with output_final_state
};

void validate(const CausalConv1dArgs& args);
void validate_backward(const CausalConv1dArgs& args, const CausalConv1dBackwardArgs& bwd);

// The weight is a frozen base weight: no gradient for it. Determinism: y, final_state, dx, dinitial_state
// bitwise identical across identical calls.
class CausalConv1d : public KernelBackend {
 public:
  static constexpr const char* kOp = "causal_conv1d";

  CausalConv1dResult forward(const CausalConv1dArgs& args) {
    validate(args);
    return run_forward(args);
  }
  CausalConv1dGrads backward(const CausalConv1dArgs& args, const CausalConv1dBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual CausalConv1dResult run_forward(const CausalConv1dArgs& args) = 0;
  virtual CausalConv1dGrads run_backward(const CausalConv1dArgs& args, const CausalConv1dBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
