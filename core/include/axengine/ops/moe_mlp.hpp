// moe.mlp — the whole expert MLP of a MoE layer as one op: routed gather → gate_up projection (+bias) →
// GLU activation → down projection (+bias) → gated combine, with LoRA on both projections. Contract:
// docs/ops/moe.mlp.md (read it before implementing a backend; this header only names things).
//
// For each active routing entry p (token t's j-th choice, expert e):
//   u_p = x_t · W1_e + b1_e + s1·(x_t · A1_eᵀ)·B1_eᵀ                       [2I]
//   h_p = act(u_p)                                                          [I]
//   y_t = Σ_j gates[t, j] · (h_p · W2_e + b2_e + s2·(h_p · A2_eᵀ)·B2_eᵀ)    [H]
// The routing, weight layouts and LoRA factor layouts are moe.experts' (moe_experts.hpp).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"
#include "axengine/ops/moe_experts.hpp"

namespace ax::ops {

// silu_glu: h = silu(gate)·up (Qwen-MoE, Mixtral, OLMoE, DeepSeek).
// clamped_glu: gpt-oss's  gate = min(gate, limit), up = clamp(up, −limit, limit),
//              h = (up + 1)·gate·σ(alpha·gate).
enum class MoeActivation { silu_glu, clamped_glu };
// Where gate and up sit in u's 2I columns: halves (gate = u[:, :I], up = u[:, I:]; the fused experts of
// transformers 5) or interleaved (gate = u[:, 0::2], up = u[:, 1::2]; gpt-oss).
enum class GluPacking { halves, interleaved };
const char* to_string(MoeActivation a);
const char* to_string(GluPacking p);

// LoRA on one projection: moe.experts' factor layout (a [r·E, K], b [N, r·E]); both or neither.
struct MoeLora {
  at::Tensor a, b;
  double scaling = 1.0;
  bool defined() const { return a.defined(); }
};

struct MoeMlpArgs {
  at::Tensor x;        // [T, H], scattered (token) order
  MoeRouting routing;  // M = T·k entries
  at::Tensor gates;    // [T, k], x's dtype: the routing weights of the combine (required)
  WeightTensor gate_up;  // logical [E, H, 2I] (EKN) or [E, 2I, H] (ENK)
  WeightTensor down;     // logical [E, I, H] (EKN) or [E, H, I] (ENK)
  ExpertLayout layout = ExpertLayout::EKN;  // of both weights
  at::Tensor gate_up_bias;  // optional [E, 2I], frozen
  at::Tensor down_bias;     // optional [E, H], frozen; enters the gated sum
  MoeLora gate_up_lora;     // optional: a [r·E, H], b [2I, r·E]
  MoeLora down_lora;        // optional: a [r·E, I], b [H, r·E]
  MoeActivation activation = MoeActivation::silu_glu;
  GluPacking packing = GluPacking::halves;
  double alpha = 1.702;  // clamped_glu only
  double limit = 7.0;    // clamped_glu only
  at::Tensor out;            // optional preallocated [T, H]
  bool check_values = true;  // moe.experts' routing content checks (a device sync)
};

struct MoeMlpResult {
  at::Tensor y;  // [T, H]
  std::vector<at::Tensor> saved;  // opaque, for this backend's backward
};

struct MoeMlpGrads {
  at::Tensor dx;                                  // like x
  at::Tensor dgate_up_lora_a, dgate_up_lora_b;    // like gate_up_lora.a / .b
  at::Tensor ddown_lora_a, ddown_lora_b;          // like down_lora.a / .b
  at::Tensor dgates;                              // like gates
};

struct MoeMlpBackwardArgs {
  at::Tensor grad_y;  // [T, H]
  std::vector<at::Tensor> saved;
  bool need_dx = true;
  bool need_dlora = true;   // both projections' factors (those that exist)
  bool need_dgates = true;
  MoeMlpGrads out;          // optional preallocated outputs (any subset)
};

// Throws UsageError "moe.mlp: <argument>: <what is wrong>" for any input outside the contract.
void validate(const MoeMlpArgs& args);
void validate_backward(const MoeMlpArgs& args, const MoeMlpBackwardArgs& bwd);
struct MoeMlpDims {
  int64_t T, M, H, I, E, k;
};
MoeMlpDims moe_mlp_dims(const MoeMlpArgs& args);

// The activation on [M, 2I] pre-activations (any float dtype; fp32 math, result in u's dtype), and its
// backward: d(u) [M, 2I] from grad_h [M, I]. Shared by every composed backend.
at::Tensor moe_glu(const at::Tensor& u, const MoeMlpArgs& args);
at::Tensor moe_glu_backward(const at::Tensor& u, const at::Tensor& grad_h, const MoeMlpArgs& args);

// The two moe.experts calls of the block (the first grouped_out, the second grouped_in with the gates).
MoeExpertsArgs moe_mlp_gate_up_args(const MoeMlpArgs& args);
MoeExpertsArgs moe_mlp_down_args(const MoeMlpArgs& args, const at::Tensor& h);

class MoeMlp : public KernelBackend {
 public:
  static constexpr const char* kOp = "moe.mlp";

  MoeMlpResult forward(const MoeMlpArgs& args) {
    validate(args);
    return run_forward(args);
  }
  MoeMlpGrads backward(const MoeMlpArgs& args, const MoeMlpBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }
  // The run-time decline: why this backend cannot serve these (valid) args — a shape outside its tiles,
  // a format pairing it does not decode — or nullopt when it can. Must be a pure function of the args
  // (shapes, dtypes, formats, flags; never tensor values): the engine asks it again before backward and
  // routes forward and backward of one call to the same backend. Cheap: it is asked on every call.
  virtual std::optional<std::string> decline(const MoeMlpArgs& args) const {
    (void)args;
    return std::nullopt;
  }

 protected:
  virtual MoeMlpResult run_forward(const MoeMlpArgs& args) = 0;
  virtual MoeMlpGrads run_backward(const MoeMlpArgs& args, const MoeMlpBackwardArgs& bwd) = 0;
};

// moe.mlp composed from a moe.experts backend: two grouped projections and the activation between them
// (plain ATen, fp32 math). Saves the pre-activations u and h for backward. The reference backend is this
// over the reference moe.experts; scattermoe is this over its kernels.
std::shared_ptr<MoeMlp> compose_moe_mlp(std::shared_ptr<MoeExperts> experts);

// A run-time fallback chain: forward/backward go to the first backend whose decline() is nullopt. Each
// (backend, reason) that passes a call on is logged once ("moe.mlp: <a> declined a call (<why>); <b>
// serves it"). Throws UsageError naming every reason when all decline.
struct NamedMoeMlp {
  std::string name;
  std::shared_ptr<MoeMlp> backend;
};
std::shared_ptr<MoeMlp> moe_mlp_chain(std::vector<NamedMoeMlp> backends);

}  // namespace ax::ops
