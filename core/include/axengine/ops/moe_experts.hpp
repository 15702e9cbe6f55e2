// moe.experts — the grouped expert projection of a MoE layer, with optional LoRA. Contract:
// docs/ops/moe.experts.md (read it before implementing a backend; this header only names things).
//
// For each active routing entry p (a (token, slot) pair routed to expert e = sorted_expert_idxs[p]):
//   y_p = x_p · W_e + bias_e + scaling · (x_p · A_eᵀ) · B_eᵀ            (W_e as [K, N])
// where x_p is row sorted_scattered_idxs[p] / k of X (scattered input) or row p of X (grouped input),
// A_e = lora_a[e·r:(e+1)·r, :], B_e = lora_b[:, e·r:(e+1)·r]. With gates, out[t] = Σ_j gates[t, j]·y_{t,j}.
#pragma once
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"
#include "axengine/ops/quant_formats.hpp"

namespace ax::ops {

enum class ExpertLayout { EKN, ENK };  // weight [E, K, N] (x·W) or HF's [E, N, K] (x·Wᵀ, nn.Linear style)
const char* to_string(ExpertLayout layout);

// Top-k routing in ScatterMoE's form. M = T·k entries, in grouped (expert-sorted) order.
//   sorted_expert_idxs    int64 [M]  expert of entry p, nondecreasing over active entries; -1 = inactive
//   sorted_scattered_idxs int64 [M]  s = t·k + j: entry p is token t's j-th choice (ignored when inactive)
//   expert_offsets        int64 [E]  cumulative END offsets: expert e owns positions [offsets[e-1], offsets[e])
// Inactive entries (-1: a token whose expert lives on another rank, or a dropped token) produce zero rows
// and no gradient. They may sit inside an expert's range or after offsets[E-1] (positions past it must
// all be inactive).
struct MoeRouting {
  at::Tensor sorted_expert_idxs;
  at::Tensor sorted_scattered_idxs;
  at::Tensor expert_offsets;
  int64_t top_k = 1;
};

struct MoeExpertsArgs {
  // X: [T, K] (scattered: entry p reads row sorted_scattered_idxs[p] / k) or [M, K] (grouped_in: row p).
  at::Tensor x;
  MoeRouting routing;
  WeightTensor weight;  // logical [E, K, N] (EKN) or [E, N, K] (ENK); mxfp4/nvfp4 blocks run along K
  ExpertLayout layout = ExpertLayout::EKN;

  at::Tensor lora_a;  // optional [r·E, K]
  at::Tensor lora_b;  // optional [N, r·E]  (both or neither)
  double scaling = 1.0;

  at::Tensor bias;   // optional [E, N]
  at::Tensor gates;  // optional [T, k]: combine the k outputs of each token (needs grouped_out == false)

  bool grouped_in = false;
  bool grouped_out = false;

  // Optional preallocated output (shape/dtype/device as the result, any strides): the backend writes
  // into it and returns it. The conformance suite passes views with guard bands here.
  at::Tensor out;

  // Content checks that read the routing on the host (a device sync): offsets consistent with the
  // expert ids, indices in range, no entry twice. The engine turns them off on hot paths whose routing it
  // built itself; shape/dtype/device checks always run.
  bool check_values = true;
};

struct MoeExpertsResult {
  // No gates: [M, N] — grouped order (grouped_out) or scattered order (row s = t·k + j).
  // Gates: [T, N].
  at::Tensor y;
  // Whatever this backend wants back in backward (opaque to the engine, may be empty). Backward is only
  // ever called with the `saved` of the same backend's forward on the same args.
  std::vector<at::Tensor> saved;
};

struct MoeExpertsGrads {
  at::Tensor dx;      // like x
  at::Tensor dlora_a; // like lora_a
  at::Tensor dlora_b; // like lora_b
  at::Tensor dgates;  // like gates
};

struct MoeExpertsBackwardArgs {
  at::Tensor grad_y;  // like y
  std::vector<at::Tensor> saved;
  bool need_dx = true;
  bool need_dlora = true;   // ignored without LoRA
  bool need_dgates = true;  // ignored without gates
  MoeExpertsGrads out;      // optional preallocated outputs (any subset)
};

// Throws UsageError "moe.experts: <argument>: <what is wrong>" for any input outside the contract.
void validate(const MoeExpertsArgs& args);
void validate_backward(const MoeExpertsArgs& args, const MoeExpertsBackwardArgs& bwd);
// Derived sizes of validated args.
struct MoeDims {
  int64_t T, M, K, N, E, k, r;  // r = 0 without LoRA
};
MoeDims moe_dims(const MoeExpertsArgs& args);

// The op interface. The engine calls forward/backward (validation, then the backend's run_*); backends
// implement run_forward/run_backward and may assume validated input (any strides, though).
// Determinism: y, dx, dlora_a, dlora_b, dgates must be bitwise identical across identical calls.
class MoeExperts : public KernelBackend {
 public:
  static constexpr const char* kOp = "moe.experts";

  MoeExpertsResult forward(const MoeExpertsArgs& args) {
    validate(args);
    return run_forward(args);
  }
  // Frozen base weights: gradients for X, the LoRA factors and the gates only. Grads not needed (or
  // not applicable) come back undefined.
  MoeExpertsGrads backward(const MoeExpertsArgs& args, const MoeExpertsBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual MoeExpertsResult run_forward(const MoeExpertsArgs& args) = 0;
  virtual MoeExpertsGrads run_backward(const MoeExpertsArgs& args, const MoeExpertsBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
