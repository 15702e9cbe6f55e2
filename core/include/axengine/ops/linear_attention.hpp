// linear_attention — the gated delta rule (Gated DeltaNet: the linear-attention layers of Qwen3-Next and
// Qwen3.5) over packed variable-length sequences, flash-linear-attention's `chunk_gated_delta_rule` form.
// Contract: docs/ops/linear_attention.md.
//
// Sequence b owns rows [cu_seqlens[b], cu_seqlens[b+1]) and starts from its own state (initial_state[b],
// or zero): the state never crosses a sequence boundary. Value head h reads key/query head h / (Hv/Hk).
// Per row t, with q and k first L2-normalised when qk_l2norm (x / sqrt(Σx² + 1e-6)) and S ∈ R^{Dk×Dv}:
//   S ← exp(g_t) · S
//   S ← S + k_t · (β_t · (v_t − Sᵀ k_t))ᵀ
//   o_t = Sᵀ (scale · q_t)
// final_state[b] is S after the sequence's last row. The state is fp32 (fp64 for fp64 inputs).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

// The q/k L2 norm's epsilon (flash-linear-attention's and transformers' l2norm).
inline constexpr double kLinearAttentionL2Eps = 1e-6;

struct LinearAttentionArgs {
  at::Tensor q;     // [T, Hk, Dk]
  at::Tensor k;     // [T, Hk, Dk]
  at::Tensor v;     // [T, Hv, Dv], q's dtype, Hv a multiple of Hk
  at::Tensor g;     // [T, Hv] fp32 (fp64 for fp64 q): the log decay, <= 0
  at::Tensor beta;  // [T, Hv], q's dtype: the write strength
  at::Tensor cu_seqlens;  // int32 [N+1], cu_seqlens[0] == 0, nondecreasing, cu_seqlens[N] == T
  double scale = 0.0;     // 0: 1/sqrt(Dk)
  bool qk_l2norm = false;  // L2-normalise q and k inside (fla's use_qk_l2norm_in_kernel)
  at::Tensor initial_state;  // optional, fp32 [N, Hv, Dk, Dv]: each sequence's starting state
  bool output_final_state = false;
  at::Tensor out;            // optional preallocated output [T, Hv, Dv]
  bool check_values = true;  // check cu_seqlens contents on the host (a device sync)
};

struct LinearAttentionResult {
  at::Tensor out;          // [T, Hv, Dv], q's dtype
  at::Tensor final_state;  // fp32 [N, Hv, Dk, Dv] when output_final_state, else undefined
  std::vector<at::Tensor> saved;  // anything the backend wants back in backward
};

struct LinearAttentionGrads {
  at::Tensor dq, dk;  // like q, k (summed over the value heads of a group)
  at::Tensor dv;      // like v
  at::Tensor dg;      // like g (fp32)
  at::Tensor dbeta;   // like beta
  at::Tensor dinitial_state;  // fp32, like initial_state; defined exactly when initial_state is
};

struct LinearAttentionBackwardArgs {
  at::Tensor grad_out;          // [T, Hv, Dv]
  at::Tensor grad_final_state;  // optional, fp32 [N, Hv, Dk, Dv]; only with output_final_state
  std::vector<at::Tensor> saved;  // the forward's
};

void validate(const LinearAttentionArgs& args);
void validate_backward(const LinearAttentionArgs& args, const LinearAttentionBackwardArgs& bwd);

// Determinism: out, final_state and every gradient bitwise identical across identical calls (dq/dk sum
// over the value heads of a group and every reduction runs in a fixed order).
class LinearAttention : public KernelBackend {
 public:
  static constexpr const char* kOp = "linear_attention";

  LinearAttentionResult forward(const LinearAttentionArgs& args) {
    validate(args);
    return run_forward(args);
  }
  LinearAttentionGrads backward(const LinearAttentionArgs& args, const LinearAttentionBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }
  // Why this backend will not take these (valid) arguments, or nullopt when it takes them (a head dim
  // outside its tiles, say); linear_attention_chain hands such a call, forward and backward, to the next
  // backend. A pure function of shapes, dtypes and flags, never of tensor values.
  virtual std::optional<std::string> decline(const LinearAttentionArgs&) const { return std::nullopt; }

 protected:
  virtual LinearAttentionResult run_forward(const LinearAttentionArgs& args) = 0;
  virtual LinearAttentionGrads run_backward(const LinearAttentionArgs& args, const LinearAttentionBackwardArgs& bwd) = 0;
};

// The backends of a preference list as one: each call goes to the first that does not decline it
// (ops/decline_chain.hpp).
struct NamedLinearAttention {
  std::string name;
  std::shared_ptr<LinearAttention> backend;
};
std::shared_ptr<LinearAttention> linear_attention_chain(std::vector<NamedLinearAttention> backends);

}  // namespace ax::ops
