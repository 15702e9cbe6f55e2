// linear_ce — the LM head and the causal-LM cross-entropy in one op: per-token loss of
//   logits = h · Wᵀ  (W the frozen, dense lm_head [V, H]; logits never need to exist whole)
//   loss[t] = logsumexp(logits[t]) - logits[t, target[t]]   (0 where target[t] == ignore_index)
// The log-sum-exp and the loss are fp32; the logits are the compute dtype's GEMM result (fp32 accumulation,
// rounded to the compute dtype, as transformers computes `lm_head(h)` before its fp32 cross-entropy).
// Contract: docs/ops/linear_ce.md. A backend may work in chunks of tokens and vocabulary so that peak memory
// stays far below T·V.
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct LinearCeArgs {
  at::Tensor h;        // [T, H], compute dtype
  at::Tensor weight;   // [V, H], compute dtype (dense; frozen: no gradient)
  at::Tensor targets;  // int64 [T], each in [0, V) or == ignore_index
  int64_t ignore_index = -100;
  bool check_values = true;  // range-check targets on the host (a device sync)
};

struct LinearCeResult {
  at::Tensor loss;  // fp32 [T], 0 at ignored targets
  at::Tensor lse;   // fp32 [T]: logsumexp of each row's logits (also at ignored targets)
};

struct LinearCeBackwardArgs {
  at::Tensor grad_loss;  // fp32 [T]
  at::Tensor lse;        // the forward's lse
};

void validate(const LinearCeArgs& args);
void validate_backward(const LinearCeArgs& args, const LinearCeBackwardArgs& bwd);

// Determinism: loss, lse and dh bitwise identical across identical calls.
class LinearCe : public KernelBackend {
 public:
  static constexpr const char* kOp = "linear_ce";

  LinearCeResult forward(const LinearCeArgs& args) {
    validate(args);
    return run_forward(args);
  }
  // dh [T, H] in the compute dtype: Σ_v grad_loss[t] · (softmax(logits[t])_v - [v == target[t]]) · W[v].
  at::Tensor backward(const LinearCeArgs& args, const LinearCeBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual LinearCeResult run_forward(const LinearCeArgs& args) = 0;
  virtual at::Tensor run_backward(const LinearCeArgs& args, const LinearCeBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
