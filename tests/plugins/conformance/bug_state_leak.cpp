// Planted bug: the linear-attention state does not reset at a sequence boundary. Each sequence of a packed
// batch starts from the state the previous one ended with (the first from initial_state[0], or zero), as
// a varlen kernel that loads the initial state once and then walks every row would. Single-sequence calls
// are right; every packed one is wrong, forward and backward alike.
#include <ATen/ATen.h>

#include <vector>

#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_state_leak", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "linear_attention", "name": "bug_state_leak",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32"]}}]
})")

namespace {

using ax::ops::LinearAttentionArgs;

// Sequence b of the call as a call of its own, starting from `start` ([Hv, Dk, Dv]).
LinearAttentionArgs one_sequence(const LinearAttentionArgs& a, int64_t r0, int64_t r1, const at::Tensor& start) {
  LinearAttentionArgs s = a;
  for (at::Tensor* t : {&s.q, &s.k, &s.v, &s.g, &s.beta}) *t = t->slice(0, r0, r1);
  s.cu_seqlens = at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(r1 - r0)}, at::kInt);
  s.initial_state = start.unsqueeze(0);
  s.output_final_state = true;
  s.out = at::Tensor();
  return s;
}

std::vector<int64_t> offsets(const LinearAttentionArgs& a) {
  at::Tensor cu = a.cu_seqlens.to(at::kLong).contiguous();
  return {cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel()};
}

struct Bug : axtest::LinearAttentionWrap {
  // The state each sequence (wrongly) starts from.
  static std::vector<at::Tensor> starts(const LinearAttentionArgs& a) {
    auto ref = axtest::reference<ax::ops::LinearAttention>();
    const std::vector<int64_t> cu = offsets(a);
    at::Tensor s = a.initial_state.defined() ? a.initial_state[0]
                                             : at::zeros({a.v.size(1), a.k.size(2), a.v.size(2)}, a.g.options());
    std::vector<at::Tensor> out;
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
      out.push_back(s);
      s = ref->forward(one_sequence(a, cu[b], cu[b + 1], s)).final_state[0];
    }
    return out;
  }

  ax::ops::LinearAttentionResult run_forward(const LinearAttentionArgs& a) override {
    auto ref = axtest::reference<ax::ops::LinearAttention>();
    const std::vector<int64_t> cu = offsets(a);
    const std::vector<at::Tensor> st = starts(a);
    std::vector<at::Tensor> outs, finals;
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
      auto r = ref->forward(one_sequence(a, cu[b], cu[b + 1], st[b]));
      outs.push_back(r.out);
      finals.push_back(r.final_state[0]);
    }
    ax::ops::LinearAttentionResult r;
    at::Tensor out = at::cat(outs);
    r.out = a.out.defined() ? a.out.copy_(out) : out;
    if (a.output_final_state) r.final_state = at::stack(finals);
    return r;
  }

  ax::ops::LinearAttentionGrads run_backward(const LinearAttentionArgs& a,
                                             const ax::ops::LinearAttentionBackwardArgs& bw) override {
    auto ref = axtest::reference<ax::ops::LinearAttention>();
    const std::vector<int64_t> cu = offsets(a);
    const std::vector<at::Tensor> st = starts(a);
    std::vector<at::Tensor> dq, dk, dv, dg, dbeta, dinit;
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
      ax::ops::LinearAttentionBackwardArgs one;
      one.grad_out = bw.grad_out.slice(0, cu[b], cu[b + 1]);
      one.grad_final_state = bw.grad_final_state.defined() ? bw.grad_final_state.narrow(0, static_cast<int64_t>(b), 1)
                                                           : at::zeros_like(st[b]).unsqueeze(0);
      auto g = ref->backward(one_sequence(a, cu[b], cu[b + 1], st[b]), one);
      dq.push_back(g.dq), dk.push_back(g.dk), dv.push_back(g.dv), dg.push_back(g.dg), dbeta.push_back(g.dbeta);
      dinit.push_back(g.dinitial_state[0]);
    }
    ax::ops::LinearAttentionGrads g;
    g.dq = at::cat(dq), g.dk = at::cat(dk), g.dv = at::cat(dv), g.dg = at::cat(dg), g.dbeta = at::cat(dbeta);
    if (a.initial_state.defined()) g.dinitial_state = at::stack(dinit);
    return g;
  }
};

}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::LinearAttention>("bug_state_leak", std::make_shared<Bug>()); }
