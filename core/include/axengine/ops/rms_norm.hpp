// rms_norm — RMSNorm of a residual stream, optionally fused with the residual add that precedes it
// (transformers' `residual + sublayer(x)` followed by the next layer norm). Contract: docs/ops/rms_norm.md.
//
//   s = x + residual                          (s = x when residual is undefined)
//   y = w · cast(s / sqrt(mean(s², over H) + eps))     (or · (1 + w) with weight_offset)
// The statistics are fp32; the normalised value is cast to the compute dtype before the scale, exactly as
// transformers' Llama/Qwen RMSNorm (`weight * hidden_states.to(input_dtype)`). s is rounded to the compute
// dtype (it is the residual stream the next layer reads), and y is computed from the rounded s.
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct RmsNormArgs {
  at::Tensor x;         // [*, H]
  at::Tensor residual;  // optional, like x
  at::Tensor weight;    // [H]
  double eps = 1e-6;
  bool weight_offset = false;  // scale by (1 + w) (Gemma, Qwen3-Next) instead of w
};

struct RmsNormResult {
  at::Tensor y;    // like x
  at::Tensor sum;  // x + residual, like x (undefined without a residual)
  at::Tensor rstd; // fp32 [rows]: 1 / sqrt(mean(s²) + eps), for the backward
};

struct RmsNormBackwardArgs {
  at::Tensor grad_y;    // like x
  at::Tensor grad_sum;  // optional, like x: the gradient reaching `sum` from later uses of the residual stream
  at::Tensor sum;       // the forward's s (the forward's `sum`, or x itself without a residual)
  at::Tensor rstd;      // the forward's rstd
  bool need_dweight = true;
};

struct RmsNormGrads {
  at::Tensor dx;       // like x; with a residual, d residual is the same tensor (s = x + residual)
  at::Tensor dweight;  // like weight (summed over every row), undefined unless need_dweight
};

void validate(const RmsNormArgs& args);
void validate_backward(const RmsNormArgs& args, const RmsNormBackwardArgs& bwd);

// Determinism: y, sum, rstd, dx, dweight bitwise identical across identical calls (dweight is a reduction
// over rows: no atomics in an unspecified order).
class RmsNorm : public KernelBackend {
 public:
  static constexpr const char* kOp = "rms_norm";

  RmsNormResult forward(const RmsNormArgs& args) {
    validate(args);
    return run_forward(args);
  }
  RmsNormGrads backward(const RmsNormArgs& args, const RmsNormBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual RmsNormResult run_forward(const RmsNormArgs& args) = 0;
  virtual RmsNormGrads run_backward(const RmsNormArgs& args, const RmsNormBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
