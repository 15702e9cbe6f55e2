// norm_rope — RMSNorm over head_dim followed by rotary position embedding (HF rotate-half convention),
// as in the q/k norms of Qwen3 / Qwen3-Next / Gemma 3. Contract: docs/ops/norm_rope.md.
//
//   n = x / sqrt(mean(x², over D) + eps) · w        (or · (1 + w) with weight_offset)
//   y[..., :R] = n[..., :R]·cos + rotate_half(n[..., :R])·sin,   y[..., R:] = n[..., R:]
// with rotate_half(u) = cat(-u[R/2:], u[:R/2]) and R the rotary dim (partial rotary when R < D).
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct NormRopeArgs {
  at::Tensor x;       // [*lead, H, D]
  at::Tensor weight;  // [D]
  double eps = 1e-6;
  bool weight_offset = false;  // scale by (1 + w) (Gemma, Qwen3-Next) instead of w

  // The rotation, one of:
  //  - cos, sin: [*lead, R] (same leading dims as x without H), or
  //  - position_ids int64 [*lead] and inv_freq fp32 [R/2]: angle = position · inv_freq, cos/sin of
  //    cat(angle, angle), times attention_scaling (HF's rotary attention_scaling, 1 for plain RoPE).
  at::Tensor cos, sin;
  at::Tensor position_ids, inv_freq;
  double attention_scaling = 1.0;

  at::Tensor out;  // optional preallocated output (like x)
};

struct NormRopeGrads {
  at::Tensor dx;       // like x
  at::Tensor dweight;  // like weight (summed over every row)
};

struct NormRopeBackwardArgs {
  at::Tensor grad_y;  // like x
  bool need_dx = true;
  bool need_dweight = true;
  NormRopeGrads out;  // optional preallocated outputs
};

void validate(const NormRopeArgs& args);
void validate_backward(const NormRopeArgs& args, const NormRopeBackwardArgs& bwd);

// Determinism: y, dx, dweight bitwise identical across identical calls (dweight is a reduction over
// rows: no atomics in an unspecified order).
class NormRope : public KernelBackend {
 public:
  static constexpr const char* kOp = "norm_rope";

  at::Tensor forward(const NormRopeArgs& args) {
    validate(args);
    return run_forward(args);
  }
  NormRopeGrads backward(const NormRopeArgs& args, const NormRopeBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual at::Tensor run_forward(const NormRopeArgs& args) = 0;
  virtual NormRopeGrads run_backward(const NormRopeArgs& args, const NormRopeBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
