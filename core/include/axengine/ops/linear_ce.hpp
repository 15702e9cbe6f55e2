// linear_ce — the LM head and the causal-LM cross-entropy in one op: per-token loss of
//   logits = h · Wᵀ  (W the frozen, dense lm_head [V, H]; logits never need to exist whole)
//   loss[t] = logsumexp(logits[t]) - logits[t, target[t]]   (0 where target[t] == ignore_index)
// The log-sum-exp and the loss are fp32; the logits are the compute dtype's GEMM result (fp32 accumulation,
// rounded to the compute dtype, as transformers computes `lm_head(h)` before its fp32 cross-entropy).
// Contract: docs/ops/linear_ce.md. A backend may work in chunks of tokens and vocabulary so that peak memory
// stays far below T·V.
//
// Gradient in the forward (grad_in_forward): training always follows the forward by a backward, and a
// chunked backward must otherwise recompute every chunk's logits (a third [T, V, H] GEMM). With the flag a
// backend may instead compute, while the chunk's logits exist, the unit gradient (grad_loss = 1)
//   dh_unit[t] = Σ_v (softmax(logits[t])_v − [v == target[t]]) · W[v]     (0 at ignored targets)
// rounded ONCE to the compute dtype, and return it in `saved`; the backward is then
//   dh[t] = round(grad_loss[t] · dh_unit[t])    (the multiply in fp32 — fp64 for fp64 inputs —, 0 at ignored)
// without touching W. That is one rounding more than the recomputing backward (which scales before its GEMM);
// the contract tolerance holds for both. Backends may ignore the flag (the reference does): `saved` comes
// back empty and the backward recomputes.
#pragma once
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct LinearCeArgs {
  at::Tensor h;        // [T, H], compute dtype
  at::Tensor weight;   // [V, H], compute dtype (dense; frozen: no gradient)
  at::Tensor targets;  // int64 [T], each in [0, V) or == ignore_index
  int64_t ignore_index = -100;
  bool check_values = true;  // range-check targets on the host (a device sync)
  // Also compute the unit gradient in the forward, for the backward that follows (see the top of the file).
  // A forward-only call (evaluation) leaves it off: it costs a GEMM.
  bool grad_in_forward = false;
};

struct LinearCeResult {
  at::Tensor loss;  // fp32 [T], 0 at ignored targets
  at::Tensor lse;   // fp32 [T]: logsumexp of each row's logits (also at ignored targets)
  // grad_in_forward, honoured: {dh_unit} ([T, H], h's dtype, contiguous); otherwise empty. Pass it back to
  // the same backend's backward unchanged.
  std::vector<at::Tensor> saved;
};

struct LinearCeBackwardArgs {
  at::Tensor grad_loss;  // fp32 [T]
  at::Tensor lse;        // the forward's lse
  std::vector<at::Tensor> saved;  // the forward's `saved`; empty: the backward recomputes the logits
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
  // dh [T, H] in the compute dtype: Σ_v grad_loss[t] · (softmax(logits[t])_v - [v == target[t]]) · W[v];
  // with bwd.saved, grad_loss[t] · dh_unit[t] (rounded as the top of the file says).
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
