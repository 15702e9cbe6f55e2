#include "models/autograd_ops.hpp"

#include <iterator>
#include <optional>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace ax::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptT = std::optional<at::Tensor>;

// The op call's state, kept on the autograd node as a capsule: the args (inputs detached, so the node does
// not own the graph before it), the backend that ran forward, and whatever that backend saved.
template <class Op, class Args>
struct State : torch::CustomClassHolder {
  std::shared_ptr<Op> op;
  Args args;
  std::vector<at::Tensor> saved;
  std::vector<bool> needs;  // requires_grad of the differentiable inputs, in forward's argument order
};

template <class S>
c10::intrusive_ptr<S> state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<S>(ctx->saved_data["state"].toCapsule());
}

OptT opt(const at::Tensor& t) { return t.defined() ? OptT(t) : std::nullopt; }
at::Tensor det(const OptT& t) { return t ? t->detach() : at::Tensor(); }
bool req(const OptT& t) { return t && t->requires_grad(); }

// ---- linear.lora
using LinState = State<ops::LinearLora, ops::LinearLoraArgs>;
struct LinearLoraFn : torch::autograd::Function<LinearLoraFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptT& a, const OptT& b,
                            c10::intrusive_ptr<LinState> st) {
    st->args.x = x.detach();
    st->args.lora_a = det(a);
    st->args.lora_b = det(b);
    st->needs = {x.requires_grad(), req(a), req(b)};
    at::Tensor y = st->op->forward(st->args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<LinState>(ctx);
    ops::LinearLoraBackwardArgs bwd;
    bwd.grad_y = grads[0].contiguous();
    bwd.need_dx = st->needs[0];
    bwd.need_dlora = st->needs[1] || st->needs[2];
    auto g = st->op->backward(st->args, bwd);
    return {st->needs[0] ? g.dx : at::Tensor(), st->needs[1] ? g.dlora_a : at::Tensor(),
            st->needs[2] ? g.dlora_b : at::Tensor(), at::Tensor()};
  }
};

// ---- norm_rope
using NrState = State<ops::NormRope, ops::NormRopeArgs>;
struct NormRopeFn : torch::autograd::Function<NormRopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, c10::intrusive_ptr<NrState> st) {
    st->args.x = x.detach();
    st->args.weight = w.detach();
    st->needs = {x.requires_grad(), w.requires_grad()};
    at::Tensor y = st->op->forward(st->args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<NrState>(ctx);
    ops::NormRopeBackwardArgs bwd;
    bwd.grad_y = grads[0].contiguous();
    bwd.need_dx = st->needs[0];
    bwd.need_dweight = st->needs[1];
    auto g = st->op->backward(st->args, bwd);
    return {st->needs[0] ? g.dx : at::Tensor(), st->needs[1] ? g.dweight : at::Tensor(), at::Tensor()};
  }
};

// ---- attention
using AttnState = State<ops::Attention, ops::AttentionArgs>;
struct AttentionFn : torch::autograd::Function<AttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const OptT& sinks, c10::intrusive_ptr<AttnState> st) {
    st->args.q = q.detach();
    st->args.k = k.detach();
    st->args.v = v.detach();
    st->args.sinks = det(sinks);
    st->needs = {q.requires_grad(), k.requires_grad(), v.requires_grad(), req(sinks)};
    auto r = st->op->forward(st->args);
    st->saved = std::move(r.saved);
    // out is this node's output: it goes through save_for_backward (no reference cycle); lse is internal.
    ctx->save_for_backward({r.out, r.lse});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return r.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<AttnState>(ctx);
    auto saved = ctx->get_saved_variables();
    ops::AttentionBackwardArgs bwd;
    bwd.grad_out = grads[0].contiguous();
    bwd.out = saved[0];
    bwd.lse = saved[1];
    bwd.saved = st->saved;
    auto g = st->op->backward(st->args, bwd);
    return {st->needs[0] ? g.dq : at::Tensor(), st->needs[1] ? g.dk : at::Tensor(), st->needs[2] ? g.dv : at::Tensor(),
            st->needs[3] ? g.dsinks : at::Tensor(), at::Tensor()};
  }
};

// ---- moe.experts
using MoeState = State<ops::MoeExperts, ops::MoeExpertsArgs>;
struct MoeExpertsFn : torch::autograd::Function<MoeExpertsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptT& a, const OptT& b, const OptT& gates,
                            c10::intrusive_ptr<MoeState> st) {
    st->args.x = x.detach();
    st->args.lora_a = det(a);
    st->args.lora_b = det(b);
    st->args.gates = det(gates);
    st->needs = {x.requires_grad(), req(a), req(b), req(gates)};
    auto r = st->op->forward(st->args);
    st->saved = std::move(r.saved);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return r.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<MoeState>(ctx);
    ops::MoeExpertsBackwardArgs bwd;
    bwd.grad_y = grads[0].contiguous();
    bwd.saved = st->saved;
    bwd.need_dx = st->needs[0];
    bwd.need_dlora = st->needs[1] || st->needs[2];
    bwd.need_dgates = st->needs[3];
    auto g = st->op->backward(st->args, bwd);
    return {st->needs[0] ? g.dx : at::Tensor(), st->needs[1] ? g.dlora_a : at::Tensor(),
            st->needs[2] ? g.dlora_b : at::Tensor(), st->needs[3] ? g.dgates : at::Tensor(), at::Tensor()};
  }
};

// ---- moe.mlp
using MlpState = State<ops::MoeMlp, ops::MoeMlpArgs>;
struct MoeMlpFn : torch::autograd::Function<MoeMlpFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gates, const OptT& a1,
                            const OptT& b1, const OptT& a2, const OptT& b2, c10::intrusive_ptr<MlpState> st) {
    st->args.x = x.detach();
    st->args.gates = gates.detach();
    st->args.gate_up_lora.a = det(a1);
    st->args.gate_up_lora.b = det(b1);
    st->args.down_lora.a = det(a2);
    st->args.down_lora.b = det(b2);
    st->needs = {x.requires_grad(), gates.requires_grad(), req(a1), req(b1), req(a2), req(b2)};
    auto r = st->op->forward(st->args);
    st->saved = std::move(r.saved);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return r.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<MlpState>(ctx);
    const auto& n = st->needs;
    ops::MoeMlpBackwardArgs bwd;
    bwd.grad_y = grads[0].contiguous();
    bwd.saved = st->saved;
    bwd.need_dx = n[0];
    bwd.need_dgates = n[1];
    bwd.need_dlora = n[2] || n[3] || n[4] || n[5];
    auto g = st->op->backward(st->args, bwd);
    auto keep = [](bool need, const at::Tensor& t) { return need ? t : at::Tensor(); };
    return {keep(n[0], g.dx), keep(n[1], g.dgates), keep(n[2], g.dgate_up_lora_a), keep(n[3], g.dgate_up_lora_b),
            keep(n[4], g.ddown_lora_a), keep(n[5], g.ddown_lora_b), at::Tensor()};
  }
};

// ---- rms_norm
using RnState = State<ops::RmsNorm, ops::RmsNormArgs>;
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  // Returns {y, sum} with a residual, {y} without.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const OptT& residual, const at::Tensor& w,
                               c10::intrusive_ptr<RnState> st) {
    st->args.x = x.detach();
    st->args.residual = det(residual);
    st->args.weight = w.detach();
    st->needs = {x.requires_grad(), req(residual), w.requires_grad()};
    auto r = st->op->forward(st->args);
    // sum is this node's output: it goes through save_for_backward (no reference cycle); rstd is internal.
    ctx->save_for_backward({r.sum, r.rstd});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    if (residual) return {r.y, r.sum};
    return {r.y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<RnState>(ctx);
    auto saved = ctx->get_saved_variables();
    ops::RmsNormBackwardArgs bwd;
    bwd.grad_y = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(st->args.x);
    if (grads.size() > 1 && grads[1].defined()) bwd.grad_sum = grads[1].contiguous();
    bwd.sum = saved[0].defined() ? saved[0] : st->args.x;
    bwd.rstd = saved[1];
    bwd.need_dweight = st->needs[2];
    auto g = st->op->backward(st->args, bwd);
    // s = x + residual: both receive ds (autograd does not accumulate in place into a shared gradient).
    return {st->needs[0] ? g.dx : at::Tensor(), st->needs[1] ? g.dx : at::Tensor(),
            st->needs[2] ? g.dweight : at::Tensor(), at::Tensor()};
  }
};

// ---- swiglu
using SwState = State<ops::Swiglu, ops::SwigluArgs>;
struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const OptT& gate, const OptT& up, const OptT& gate_up,
                            c10::intrusive_ptr<SwState> st) {
    st->args.gate = det(gate);
    st->args.up = det(up);
    st->args.gate_up = det(gate_up);
    st->needs = {req(gate), req(up), req(gate_up)};
    at::Tensor y = st->op->forward(st->args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<SwState>(ctx);
    ops::SwigluBackwardArgs bwd;
    bwd.grad_y = grads[0].contiguous();
    auto g = st->op->backward(st->args, bwd);
    return {st->needs[0] ? g.dgate : at::Tensor(), st->needs[1] ? g.dup : at::Tensor(),
            st->needs[2] ? g.dgate_up : at::Tensor(), at::Tensor()};
  }
};

// ---- linear_ce
using CeState = State<ops::LinearCe, ops::LinearCeArgs>;
struct LinearCeFn : torch::autograd::Function<LinearCeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, c10::intrusive_ptr<CeState> st) {
    st->args.h = h.detach();
    st->args.weight = st->args.weight.detach();
    st->needs = {h.requires_grad()};
    auto r = st->op->forward(st->args);
    // Internal (not outputs): no reference cycle through the state. saved[0] is lse, then the backend's
    // own `saved` (the unit gradient when it honoured grad_in_forward).
    st->saved = {r.lse};
    st->saved.insert(st->saved.end(), r.saved.begin(), r.saved.end());
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return r.loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<CeState>(ctx);
    if (!st->needs[0]) return {at::Tensor(), at::Tensor()};
    ops::LinearCeBackwardArgs bwd;
    bwd.grad_loss = grads[0].contiguous();
    bwd.lse = st->saved[0];
    // The unit gradient ([T, H]) is used once: released here rather than with the graph, after the whole
    // backward. A second backward through a retained graph finds it gone and recomputes (same contract).
    bwd.saved.assign(std::make_move_iterator(st->saved.begin() + 1), std::make_move_iterator(st->saved.end()));
    st->saved.resize(1);
    return {st->op->backward(st->args, bwd), at::Tensor()};
  }
};

// ---- linear_attention
// No backend keeps anything in `saved` that autograd owns (out is recomputed or not needed by backward), so
// the state holds it as attention's does.
using LaState = State<ops::LinearAttention, ops::LinearAttentionArgs>;
struct LinearAttentionFn : torch::autograd::Function<LinearAttentionFn> {
  // Returns {out, final_state} with output_final_state, {out} without.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& g, const at::Tensor& beta, const OptT& init, c10::intrusive_ptr<LaState> st) {
    st->args.q = q.detach();
    st->args.k = k.detach();
    st->args.v = v.detach();
    st->args.g = g.detach();
    st->args.beta = beta.detach();
    st->args.initial_state = det(init);
    st->args.out = at::Tensor();  // a preallocated output would be this node's output and an input at once
    st->needs = {q.requires_grad(), k.requires_grad(), v.requires_grad(), g.requires_grad(), beta.requires_grad(), req(init)};
    auto r = st->op->forward(st->args);
    st->saved = std::move(r.saved);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    if (st->args.output_final_state) return {r.out, r.final_state};
    return {r.out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<LaState>(ctx);
    const auto& n = st->needs;
    ops::LinearAttentionBackwardArgs bwd;
    bwd.grad_out = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(st->args.v);
    if (grads.size() > 1 && grads[1].defined()) bwd.grad_final_state = grads[1].contiguous();
    bwd.saved = st->saved;
    auto g = st->op->backward(st->args, bwd);
    auto keep = [](bool need, const at::Tensor& t) { return need ? t : at::Tensor(); };
    return {keep(n[0], g.dq), keep(n[1], g.dk), keep(n[2], g.dv), keep(n[3], g.dg), keep(n[4], g.dbeta),
            keep(n[5], g.dinitial_state), at::Tensor()};
  }
};

// ---- causal_conv1d
using ConvState = State<ops::CausalConv1d, ops::CausalConv1dArgs>;
struct CausalConv1dFn : torch::autograd::Function<CausalConv1dFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const OptT& init, c10::intrusive_ptr<ConvState> st) {
    st->args.x = x.detach();
    st->args.weight = st->args.weight.detach();
    st->args.initial_state = det(init);
    st->args.out = at::Tensor();
    st->needs = {x.requires_grad(), req(init)};
    auto r = st->op->forward(st->args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    if (st->args.output_final_state) return {r.y, r.final_state};
    return {r.y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = state_of<ConvState>(ctx);
    ops::CausalConv1dBackwardArgs bwd;
    bwd.grad_y = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(st->args.x);
    if (grads.size() > 1 && grads[1].defined()) bwd.grad_final_state = grads[1].contiguous();
    auto g = st->op->backward(st->args, bwd);
    return {st->needs[0] ? g.dx : at::Tensor(), st->needs[1] ? g.dinitial_state : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LinearAttentionOutput linear_attention(const std::shared_ptr<ops::LinearAttention>& op, ops::LinearAttentionArgs args) {
  auto st = c10::make_intrusive<LaState>();
  st->op = op;
  at::Tensor q = args.q, k = args.k, v = args.v, g = args.g, beta = args.beta, init = args.initial_state;
  st->args = std::move(args);
  auto outs = LinearAttentionFn::apply(q, k, v, g, beta, opt(init), st);
  return {outs[0], outs.size() > 1 ? outs[1] : at::Tensor()};
}

CausalConv1dOutput causal_conv1d(const std::shared_ptr<ops::CausalConv1d>& op, ops::CausalConv1dArgs args) {
  auto st = c10::make_intrusive<ConvState>();
  st->op = op;
  at::Tensor x = args.x, init = args.initial_state;
  st->args = std::move(args);
  auto outs = CausalConv1dFn::apply(x, opt(init), st);
  return {outs[0], outs.size() > 1 ? outs[1] : at::Tensor()};
}

RmsNormOutput rms_norm(const std::shared_ptr<ops::RmsNorm>& op, ops::RmsNormArgs args) {
  auto st = c10::make_intrusive<RnState>();
  st->op = op;
  at::Tensor x = args.x, r = args.residual, w = args.weight;
  st->args = std::move(args);
  auto outs = RmsNormFn::apply(x, opt(r), w, st);
  return {outs[0], outs.size() > 1 ? outs[1] : at::Tensor()};
}

at::Tensor swiglu(const std::shared_ptr<ops::Swiglu>& op, ops::SwigluArgs args) {
  auto st = c10::make_intrusive<SwState>();
  st->op = op;
  at::Tensor g = args.gate, u = args.up, gu = args.gate_up;
  st->args = std::move(args);
  return SwigluFn::apply(opt(g), opt(u), opt(gu), st);
}

at::Tensor linear_ce(const std::shared_ptr<ops::LinearCe>& op, ops::LinearCeArgs args) {
  auto st = c10::make_intrusive<CeState>();
  st->op = op;
  at::Tensor h = args.h;
  // A backward will follow exactly when autograd records this call: then the backend may compute the
  // gradient while the logits exist (one GEMM less). Decided here, not in forward(), where apply() has
  // already switched grad mode off. Evaluation (no grad mode, or a frozen h) pays no extra GEMM.
  args.grad_in_forward = at::GradMode::is_enabled() && h.requires_grad();
  st->args = std::move(args);
  return LinearCeFn::apply(h, st);
}

at::Tensor linear_lora(const std::shared_ptr<ops::LinearLora>& op, ops::LinearLoraArgs args) {
  auto st = c10::make_intrusive<LinState>();
  st->op = op;
  at::Tensor x = args.x, a = args.lora_a, b = args.lora_b;
  st->args = std::move(args);
  return LinearLoraFn::apply(x, opt(a), opt(b), st);
}

at::Tensor norm_rope(const std::shared_ptr<ops::NormRope>& op, ops::NormRopeArgs args) {
  auto st = c10::make_intrusive<NrState>();
  st->op = op;
  at::Tensor x = args.x, w = args.weight;
  st->args = std::move(args);
  return NormRopeFn::apply(x, w, st);
}

at::Tensor attention(const std::shared_ptr<ops::Attention>& op, ops::AttentionArgs args) {
  auto st = c10::make_intrusive<AttnState>();
  st->op = op;
  at::Tensor q = args.q, k = args.k, v = args.v, sinks = args.sinks;
  st->args = std::move(args);
  return AttentionFn::apply(q, k, v, opt(sinks), st);
}

at::Tensor moe_experts(const std::shared_ptr<ops::MoeExperts>& op, ops::MoeExpertsArgs args) {
  auto st = c10::make_intrusive<MoeState>();
  st->op = op;
  at::Tensor x = args.x, a = args.lora_a, b = args.lora_b, g = args.gates;
  st->args = std::move(args);
  return MoeExpertsFn::apply(x, opt(a), opt(b), opt(g), st);
}

at::Tensor moe_mlp(const std::shared_ptr<ops::MoeMlp>& op, ops::MoeMlpArgs args) {
  auto st = c10::make_intrusive<MlpState>();
  st->op = op;
  at::Tensor x = args.x, g = args.gates, a1 = args.gate_up_lora.a, b1 = args.gate_up_lora.b, a2 = args.down_lora.a,
             b2 = args.down_lora.b;
  st->args = std::move(args);
  return MoeMlpFn::apply(x, g, opt(a1), opt(b1), opt(a2), opt(b2), st);
}

}  // namespace ax::autograd
