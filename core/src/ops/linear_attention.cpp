// validate() for linear_attention, and its decline chain.
#include "axengine/ops/linear_attention.hpp"

#include <ATen/ATen.h>

#include "axengine/ops/decline_chain.hpp"
#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kLinearAttentionOp = "linear_attention";

// The state's and the decay's dtype: fp32, fp64 for fp64 inputs (the gradient-check mode).
at::ScalarType state_dtype(const LinearAttentionArgs& a) {
  return a.q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> state_shape(const LinearAttentionArgs& a) {
  return {a.cu_seqlens.size(0) - 1, a.v.size(1), a.k.size(2), a.v.size(2)};
}
}  // namespace

void validate(const LinearAttentionArgs& a) {
  check::rank(kLinearAttentionOp, "q", a.q, 3);
  check::compute_dtype(kLinearAttentionOp, "q", a.q);
  const auto dt = a.q.scalar_type();
  const auto st = state_dtype(a);
  const at::Device dev = a.q.device();
  const int64_t T = a.q.size(0), Hk = a.q.size(1), Dk = a.q.size(2);
  if (Hk < 1) check::fail(kLinearAttentionOp, "q", "needs at least one head");
  if (Dk < 1) check::fail(kLinearAttentionOp, "q", "head_dim must be >= 1");
  check::shape(kLinearAttentionOp, "k", a.k, {T, Hk, Dk});
  check::rank(kLinearAttentionOp, "v", a.v, 3);
  const int64_t Hv = a.v.size(1);
  check::shape(kLinearAttentionOp, "v", a.v, {T, -1, -1});
  if (Hv < 1 || Hv % Hk != 0)
    check::fail(kLinearAttentionOp, "v", str("has ", Hv, " heads, which must be a multiple of q/k's ", Hk, " heads"));
  if (a.v.size(2) < 1) check::fail(kLinearAttentionOp, "v", "head_dim must be >= 1");
  check::shape(kLinearAttentionOp, "g", a.g, {T, Hv});
  check::shape(kLinearAttentionOp, "beta", a.beta, {T, Hv});
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"k", &a.k}, {"v", &a.v}, {"beta", &a.beta}}) {
    check::dtype(kLinearAttentionOp, name, *t, dt);
    check::same_device(kLinearAttentionOp, name, *t, "q", dev);
  }
  check::dtype(kLinearAttentionOp, "g", a.g, st);
  check::same_device(kLinearAttentionOp, "g", a.g, "q", dev);
  check::cu_seqlens(kLinearAttentionOp, "cu_seqlens", a.cu_seqlens, T, dev, "q", a.check_values);
  if (!(a.scale >= 0)) check::fail(kLinearAttentionOp, "scale", str("must be >= 0 (0 = 1/sqrt(Dk)), got ", a.scale));
  if (a.initial_state.defined()) {
    check::shape(kLinearAttentionOp, "initial_state", a.initial_state, state_shape(a));
    check::dtype(kLinearAttentionOp, "initial_state", a.initial_state, st);
    check::same_device(kLinearAttentionOp, "initial_state", a.initial_state, "q", dev);
  }
  check::out_like(kLinearAttentionOp, "out", a.out, a.v.sizes(), dt, dev);
}

void validate_backward(const LinearAttentionArgs& a, const LinearAttentionBackwardArgs& b) {
  check::defined(kLinearAttentionOp, "grad_out", b.grad_out);
  check::out_like(kLinearAttentionOp, "grad_out", b.grad_out, a.v.sizes(), a.q.scalar_type(), a.q.device());
  if (b.grad_final_state.defined()) {
    if (!a.output_final_state)
      check::fail(kLinearAttentionOp, "grad_final_state", "is given but the forward returned no final state (output_final_state)");
    check::out_like(kLinearAttentionOp, "grad_final_state", b.grad_final_state, state_shape(a), state_dtype(a), a.q.device());
  }
}

std::shared_ptr<LinearAttention> linear_attention_chain(std::vector<NamedLinearAttention> backends) {
  return std::make_shared<DeclineChain<LinearAttention, NamedLinearAttention, LinearAttentionArgs, LinearAttentionResult,
                                       LinearAttentionBackwardArgs, LinearAttentionGrads>>(std::move(backends));
}

}  // namespace ax::ops
