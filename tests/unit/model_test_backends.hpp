// Test-only backends of the ops a decoder uses, written the naive way (loops, gathers, the math of
// the op contracts straight from the headers) with backward by recomputation under autograd. They let the
// model parity tests run against HF goldens independently of any production backend: the model code sees
// them only through a KernelSet, exactly as it sees `reference` or a plugin.
#pragma once
#include <memory>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "axengine/ops/attention.hpp"
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/ops/linear_attention.hpp"
#include "axengine/ops/linear_ce.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"
#include "axengine/registry.hpp"
#include "axengine/selection.hpp"

namespace ax::test {

// Recomputes `f` on leaf copies of `inputs` (undefined entries stay undefined) and returns d(out)/d(input).
template <class F>
std::vector<at::Tensor> recompute_grads(const std::vector<at::Tensor>& inputs, const at::Tensor& grad_out, F f) {
  c10::AutoGradMode on(true);
  std::vector<at::Tensor> leaves, diff;
  for (const auto& t : inputs) {
    leaves.push_back(t.defined() ? t.detach().clone().requires_grad_(t.is_floating_point()) : at::Tensor());
    if (leaves.back().defined() && leaves.back().requires_grad()) diff.push_back(leaves.back());
  }
  at::Tensor out = f(leaves);
  auto g = torch::autograd::grad({out}, diff, {grad_out}, false, false, true);
  std::vector<at::Tensor> res;
  std::size_t k = 0;
  for (const auto& l : leaves) res.push_back(l.defined() && l.requires_grad() ? g[k++] : at::Tensor());
  return res;
}

struct NaiveLinearLora : ops::LinearLora {
  static at::Tensor f(const ops::LinearLoraArgs& a, const at::Tensor& x, const at::Tensor& A, const at::Tensor& B) {
    at::Tensor y = at::matmul(x, a.weight.values.t());
    if (a.bias.defined()) y = y + a.bias;
    if (A.defined()) y = y + at::matmul(at::matmul(x, A.t()), B.t()) * a.scaling;
    return y;
  }
  at::Tensor run_forward(const ops::LinearLoraArgs& a) override { return f(a, a.x, a.lora_a, a.lora_b); }
  ops::LinearLoraGrads run_backward(const ops::LinearLoraArgs& a, const ops::LinearLoraBackwardArgs& b) override {
    auto g = recompute_grads({a.x, a.lora_a, a.lora_b}, b.grad_y, [&](auto& v) { return f(a, v[0], v[1], v[2]); });
    return {g[0], g[1], g[2]};
  }
};

struct NaiveNormRope : ops::NormRope {
  static at::Tensor f(const ops::NormRopeArgs& a, const at::Tensor& x, const at::Tensor& w) {
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor n = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + a.eps)).to(x.scalar_type()) * (a.weight_offset ? w + 1 : w);
    at::Tensor cos = a.cos, sin = a.sin;
    if (!cos.defined()) {
      at::Tensor ang = a.position_ids.to(at::kFloat).unsqueeze(-1) * a.inv_freq;
      at::Tensor emb = at::cat({ang, ang}, -1);
      cos = (emb.cos() * a.attention_scaling).to(x.scalar_type());
      sin = (emb.sin() * a.attention_scaling).to(x.scalar_type());
    }
    const int64_t R = cos.size(-1), D = x.size(-1);
    cos = cos.unsqueeze(-2);
    sin = sin.unsqueeze(-2);
    at::Tensor r = n.narrow(-1, 0, R);
    at::Tensor rot = at::cat({-r.narrow(-1, R / 2, R / 2), r.narrow(-1, 0, R / 2)}, -1);
    at::Tensor y = r * cos + rot * sin;
    return R == D ? y : at::cat({y, n.narrow(-1, R, D - R)}, -1);
  }
  at::Tensor run_forward(const ops::NormRopeArgs& a) override { return f(a, a.x, a.weight); }
  ops::NormRopeGrads run_backward(const ops::NormRopeArgs& a, const ops::NormRopeBackwardArgs& b) override {
    auto g = recompute_grads({a.x, a.weight}, b.grad_y, [&](auto& v) { return f(a, v[0], v[1]); });
    return {g[0], g[1]};
  }
};

struct NaiveAttention : ops::Attention {
  static at::Tensor f(const ops::AttentionArgs& a, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      at::Tensor* lse_out) {
    at::Tensor cu = a.cu_seqlens.to(at::kCPU, at::kLong);
    const int64_t Hq = q.size(1), Hkv = k.size(1), D = q.size(2);
    const double scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(double(D));
    std::vector<at::Tensor> outs, lses;
    for (int64_t b = 0; b + 1 < cu.size(0); ++b) {
      int64_t s = cu[b].item<int64_t>(), e = cu[b + 1].item<int64_t>(), L = e - s;
      if (L == 0) continue;
      at::Tensor qb = q.narrow(0, s, L).transpose(0, 1);  // [Hq, L, D]
      at::Tensor kb = k.narrow(0, s, L).repeat_interleave(Hq / Hkv, 1).transpose(0, 1);
      at::Tensor vb = v.narrow(0, s, L).repeat_interleave(Hq / Hkv, 1).transpose(0, 1);
      at::Tensor sc = at::matmul(qb.to(at::kFloat), kb.to(at::kFloat).transpose(1, 2)) * scale;
      at::Tensor i = at::arange(L).unsqueeze(1), j = at::arange(L).unsqueeze(0);
      at::Tensor allowed = a.causal ? (j <= i) : at::ones({L, L}, at::kBool);
      if (a.groups.defined()) {  // bidirectional groups: a row sees its group's rows wherever they are
        at::Tensor g = a.groups.to(at::kCPU, at::kLong).narrow(0, s, L);
        allowed = allowed.logical_or((g.unsqueeze(1) == g.unsqueeze(0)).logical_and(g.unsqueeze(1) >= 0));
      }
      if (a.window_left >= 0) allowed = allowed.logical_and(j >= i - a.window_left);
      sc = sc.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
      if (a.sinks.defined()) {
        // transformers' eager gpt_oss attention: the sink as one more softmax column, dropped after.
        at::Tensor full = at::cat({sc, a.sinks.to(at::kFloat).view({Hq, 1, 1}).expand({Hq, L, 1})}, -1);
        lses.push_back(at::logsumexp(full, -1));
        at::Tensor p = at::softmax(full, -1).narrow(-1, 0, L);
        outs.push_back(at::matmul(p, vb.to(at::kFloat)).to(q.scalar_type()).transpose(0, 1));
        continue;
      }
      lses.push_back(at::logsumexp(sc, -1));
      outs.push_back(at::matmul(at::softmax(sc, -1), vb.to(at::kFloat)).to(q.scalar_type()).transpose(0, 1));
    }
    if (lse_out) *lse_out = at::cat(lses, 1);
    return at::cat(outs, 0);
  }
  ops::AttentionResult run_forward(const ops::AttentionArgs& a) override {
    ops::AttentionResult r;
    r.out = f(a, a.q, a.k, a.v, &r.lse);
    return r;
  }
  ops::AttentionGrads run_backward(const ops::AttentionArgs& a, const ops::AttentionBackwardArgs& b) override {
    auto g = recompute_grads({a.q, a.k, a.v}, b.grad_out, [&](auto& v) { return f(a, v[0], v[1], v[2], nullptr); });
    return {g[0], g[1], g[2]};
  }
};

struct NaiveMoeExperts : ops::MoeExperts {
  static at::Tensor f(const ops::MoeExpertsArgs& a, const at::Tensor& x, const at::Tensor& A, const at::Tensor& B,
                      const at::Tensor& gates) {
    const auto& r = a.routing;
    const int64_t k = r.top_k, M = r.sorted_expert_idxs.size(0);
    at::Tensor eidx = r.sorted_expert_idxs, sidx = r.sorted_scattered_idxs;
    at::Tensor active = eidx >= 0;
    at::Tensor e = eidx.clamp_min(0);
    at::Tensor xs = a.grouped_in ? x : x.index_select(0, at::div(sidx.clamp_min(0), k, "floor"));
    at::Tensor W = a.weight.values.index_select(0, e);  // [M, ...]
    if (a.layout == ops::ExpertLayout::EKN) W = W.transpose(1, 2);  // -> [M, N, K]
    at::Tensor y = at::bmm(W, xs.unsqueeze(-1)).squeeze(-1);  // [M, N]
    if (a.bias.defined()) y = y + a.bias.index_select(0, e);
    if (A.defined()) {
      const int64_t E = a.weight.shape[0], rr = A.size(0) / E;
      at::Tensor Ae = A.view({E, rr, -1}).index_select(0, e);                          // [M, r, K]
      at::Tensor Be = B.view({B.size(0), E, rr}).permute({1, 0, 2}).index_select(0, e);  // [M, N, r]
      y = y + at::bmm(Be, at::bmm(Ae, xs.unsqueeze(-1))).squeeze(-1) * a.scaling;
    }
    y = y * active.unsqueeze(-1).to(y.scalar_type());
    if (gates.defined()) {
      const int64_t T = gates.size(0);
      at::Tensor g = gates.reshape({-1}).index_select(0, sidx.clamp_min(0));  // gate of each entry
      at::Tensor tok = at::div(sidx.clamp_min(0), k, "floor");
      at::Tensor out = at::zeros({T, y.size(1)}, y.options());
      return out.index_add(0, tok, y * g.unsqueeze(-1));
    }
    if (a.grouped_out) return y;
    at::Tensor out = at::zeros({M, y.size(1)}, y.options());
    return out.index_add(0, sidx.clamp_min(0), y);
  }
  ops::MoeExpertsResult run_forward(const ops::MoeExpertsArgs& a) override {
    return {f(a, a.x, a.lora_a, a.lora_b, a.gates), {}};
  }
  ops::MoeExpertsGrads run_backward(const ops::MoeExpertsArgs& a, const ops::MoeExpertsBackwardArgs& b) override {
    auto g = recompute_grads({a.x, a.lora_a, a.lora_b, a.gates}, b.grad_y,
                             [&](auto& v) { return f(a, v[0], v[1], v[2], v[3]); });
    return {g[0], g[1], g[2], g[3]};
  }
};

// The whole expert block as transformers writes it: NaiveMoeExperts twice, the activation in the input dtype
// between them (SiLU·up from the halves, or gpt-oss's clamped GLU on the interleaved columns).
struct NaiveMoeMlp : ops::MoeMlp {
  static at::Tensor f(const ops::MoeMlpArgs& a, const std::vector<at::Tensor>& v) {  // x, gates, A1, B1, A2, B2
    at::Tensor u = NaiveMoeExperts::f(ops::moe_mlp_gate_up_args(a), v[0], v[2], v[3], at::Tensor());
    const int64_t I = u.size(1) / 2;
    const bool halves = a.packing == ops::GluPacking::halves;
    at::Tensor g = halves ? u.narrow(1, 0, I) : u.slice(1, 0, 2 * I, 2), up = halves ? u.narrow(1, I, I) : u.slice(1, 1, 2 * I, 2);
    at::Tensor h;
    if (a.activation == ops::MoeActivation::silu_glu) {
      h = at::silu(g) * up;
    } else {
      g = g.clamp_max(a.limit);
      h = (up.clamp(-a.limit, a.limit) + 1) * (g * at::sigmoid(g * a.alpha));
    }
    return NaiveMoeExperts::f(ops::moe_mlp_down_args(a, h), h, v[4], v[5], v[1]);
  }
  static std::vector<at::Tensor> inputs(const ops::MoeMlpArgs& a) {
    return {a.x, a.gates, a.gate_up_lora.a, a.gate_up_lora.b, a.down_lora.a, a.down_lora.b};
  }
  ops::MoeMlpResult run_forward(const ops::MoeMlpArgs& a) override { return {f(a, inputs(a)), {}}; }
  ops::MoeMlpGrads run_backward(const ops::MoeMlpArgs& a, const ops::MoeMlpBackwardArgs& b) override {
    auto g = recompute_grads(inputs(a), b.grad_y, [&](auto& v) { return f(a, v); });
    return {g[0], g[2], g[3], g[4], g[5], g[1]};
  }
};

// transformers' LlamaRMSNorm after `residual + hidden_states`, in the input dtype.
struct NaiveRmsNorm : ops::RmsNorm {
  static std::pair<at::Tensor, at::Tensor> f(const ops::RmsNormArgs& a, const at::Tensor& x, const at::Tensor& w) {
    at::Tensor s = a.residual.defined() ? a.residual + x : x;
    at::Tensor sf = s.to(at::kFloat);
    at::Tensor n = (sf * at::rsqrt(sf.pow(2).mean(-1, true) + a.eps)).to(x.scalar_type());
    return {n * (a.weight_offset ? w + 1 : w), s};
  }
  ops::RmsNormResult run_forward(const ops::RmsNormArgs& a) override {
    auto [y, s] = f(a, a.x, a.weight);
    at::Tensor sf = s.to(at::kFloat);
    at::Tensor rstd = at::rsqrt(sf.pow(2).mean(-1) + a.eps).reshape({-1});
    return {y, a.residual.defined() ? s : at::Tensor(), rstd};
  }
  ops::RmsNormGrads run_backward(const ops::RmsNormArgs& a, const ops::RmsNormBackwardArgs& b) override {
    c10::AutoGradMode on(true);
    at::Tensor x = a.x.detach().clone().requires_grad_(true), w = a.weight.detach().clone().requires_grad_(true);
    auto [y, s] = f(a, x, w);
    std::vector<at::Tensor> outs{y}, seeds{b.grad_y};
    if (b.grad_sum.defined()) {
      outs.push_back(s);
      seeds.push_back(b.grad_sum);
    }
    auto g = torch::autograd::grad(outs, {x, w}, seeds);
    return {g[0], b.need_dweight ? g[1] : at::Tensor()};
  }
};

// transformers' `act_fn(gate_proj(x)) * up_proj(x)`, in the input dtype.
struct NaiveSwiglu : ops::Swiglu {
  static at::Tensor f(const at::Tensor& g, const at::Tensor& u) { return at::silu(g) * u; }
  static at::Tensor fused(const at::Tensor& gu) {
    const int64_t I = gu.size(-1) / 2;
    return f(gu.narrow(-1, 0, I), gu.narrow(-1, I, I));
  }
  at::Tensor run_forward(const ops::SwigluArgs& a) override {
    return (a.gate_up.defined() ? fused(a.gate_up) : f(a.gate, a.up)).contiguous();
  }
  ops::SwigluGrads run_backward(const ops::SwigluArgs& a, const ops::SwigluBackwardArgs& b) override {
    if (a.gate_up.defined()) {
      auto g = recompute_grads({a.gate_up}, b.grad_y, [&](auto& v) { return fused(v[0]); });
      return {at::Tensor(), at::Tensor(), g[0].contiguous()};
    }
    auto g = recompute_grads({a.gate, a.up}, b.grad_y, [&](auto& v) { return f(v[0], v[1]); });
    return {g[0], g[1], at::Tensor()};
  }
};

// transformers' lm_head then fp32 cross_entropy (reduction none), logits whole.
struct NaiveLinearCe : ops::LinearCe {
  static at::Tensor f(const ops::LinearCeArgs& a, const at::Tensor& h) {
    at::Tensor logits = at::matmul(h, a.weight.t()).to(at::kFloat);
    return at::cross_entropy_loss(logits, a.targets, {}, at::Reduction::None, a.ignore_index);
  }
  ops::LinearCeResult run_forward(const ops::LinearCeArgs& a) override {
    return {f(a, a.h), at::logsumexp(at::matmul(a.h, a.weight.t()).to(at::kFloat), 1)};
  }
  at::Tensor run_backward(const ops::LinearCeArgs& a, const ops::LinearCeBackwardArgs& b) override {
    return recompute_grads({a.h}, b.grad_loss, [&](auto& v) { return f(a, v[0]); })[0];
  }
};

// The gated delta rule token by token (docs/ops/linear_attention.md's recurrence), fp32 state.
struct NaiveLinearAttention : ops::LinearAttention {
  static std::pair<at::Tensor, at::Tensor> f(const ops::LinearAttentionArgs& a, at::Tensor q, at::Tensor k, at::Tensor v,
                                             at::Tensor g, at::Tensor beta, const at::Tensor& init) {
    const auto ct = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const auto out_type = v.scalar_type();
    q = q.to(ct), k = k.to(ct), v = v.to(ct), g = g.to(ct), beta = beta.to(ct);
    if (a.qk_l2norm) {
      q = q / at::sqrt((q * q).sum(-1, true) + ops::kLinearAttentionL2Eps);
      k = k / at::sqrt((k * k).sum(-1, true) + ops::kLinearAttentionL2Eps);
    }
    const int64_t Hv = v.size(1), Dk = q.size(2), Dv = v.size(2), G = Hv / q.size(1);
    const double scale = a.scale > 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(Dk));
    q = q.repeat_interleave(G, 1) * scale;  // value head h reads key head h / G
    k = k.repeat_interleave(G, 1);
    at::Tensor cu = a.cu_seqlens.to(at::kCPU, at::kLong);
    std::vector<at::Tensor> outs, finals;
    for (int64_t b = 0; b + 1 < cu.size(0); ++b) {
      at::Tensor S = init.defined() ? init[b].to(ct) : at::zeros({Hv, Dk, Dv}, q.options());
      for (int64_t t = cu[b].item<int64_t>(); t < cu[b + 1].item<int64_t>(); ++t) {
        S = S * at::exp(g[t]).view({Hv, 1, 1});
        at::Tensor u = v[t] - (S * k[t].unsqueeze(-1)).sum(1);  // v − Sᵀk
        S = S + k[t].unsqueeze(-1) * (beta[t].unsqueeze(-1) * u).unsqueeze(1);
        outs.push_back((S * q[t].unsqueeze(-1)).sum(1));
      }
      finals.push_back(S);
    }
    at::Tensor out = outs.empty() ? at::zeros({0, Hv, Dv}, q.options()) : at::stack(outs);
    return {out.to(out_type), at::stack(finals)};
  }
  ops::LinearAttentionResult run_forward(const ops::LinearAttentionArgs& a) override {
    auto [o, s] = f(a, a.q, a.k, a.v, a.g, a.beta, a.initial_state);
    ops::LinearAttentionResult r;
    r.out = o;
    if (a.output_final_state) r.final_state = s;
    return r;
  }
  ops::LinearAttentionGrads run_backward(const ops::LinearAttentionArgs& a, const ops::LinearAttentionBackwardArgs& b) override {
    auto g = recompute_grads({a.q, a.k, a.v, a.g, a.beta, a.initial_state}, at::ones({}, at::kDouble).to(a.g.scalar_type()), [&](auto& x) {
      auto [o, s] = f(a, x[0], x[1], x[2], x[3], x[4], x[5]);
      at::Tensor l = (o.to(at::kDouble) * b.grad_out.to(at::kDouble)).sum();
      if (b.grad_final_state.defined()) l = l + (s.to(at::kDouble) * b.grad_final_state.to(at::kDouble)).sum();
      return l.to(a.g.scalar_type());
    });
    return {g[0], g[1], g[2], g[3], g[4], g[5]};
  }
};

// The depthwise causal conv + SiLU per sequence, the window from the initial state (or zeros).
struct NaiveCausalConv1d : ops::CausalConv1d {
  static std::pair<at::Tensor, at::Tensor> f(const ops::CausalConv1dArgs& a, const at::Tensor& x, const at::Tensor& init) {
    const int64_t C = x.size(1), W = a.weight.size(1);
    const auto ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor cu = a.cu_seqlens.to(at::kCPU, at::kLong), w = a.weight.to(ct);
    std::vector<at::Tensor> ys, finals;
    for (int64_t b = 0; b + 1 < cu.size(0); ++b) {
      const int64_t r0 = cu[b].item<int64_t>(), n = cu[b + 1].item<int64_t>() - r0;
      at::Tensor before = init.defined() ? init[b].to(ct) : at::zeros({W - 1, C}, x.options().dtype(ct));
      at::Tensor ext = at::cat({before, x.narrow(0, r0, n).to(ct)});
      at::Tensor acc = at::zeros({n, C}, ext.options());
      for (int64_t j = 0; j < W; ++j) acc = acc + ext.narrow(0, j, n) * w.select(1, j);
      ys.push_back(at::silu(acc).to(x.scalar_type()));
      finals.push_back(ext.narrow(0, n, W - 1).to(x.scalar_type()));
    }
    return {at::cat(ys), at::stack(finals)};
  }
  ops::CausalConv1dResult run_forward(const ops::CausalConv1dArgs& a) override {
    auto [y, s] = f(a, a.x, a.initial_state);
    ops::CausalConv1dResult r;
    r.y = y;
    if (a.output_final_state) r.final_state = s;
    return r;
  }
  ops::CausalConv1dGrads run_backward(const ops::CausalConv1dArgs& a, const ops::CausalConv1dBackwardArgs& b) override {
    auto g = recompute_grads({a.x, a.initial_state}, at::ones({}, a.x.options()), [&](auto& x) {
      auto [y, s] = f(a, x[0], x[1]);
      at::Tensor l = (y * b.grad_y).sum();
      if (b.grad_final_state.defined()) l = l + (s * b.grad_final_state).sum();
      return l;
    });
    return {g[0], g[1]};
  }
};

inline void add_naive_backends(Registry& r) {
  auto add = [&](const char* op, std::shared_ptr<void> obj) {
    Provider p;
    p.info.kind = ProviderKind::kernel;
    p.info.op = op;
    p.info.name = "naive_test";
    p.object = std::move(obj);
    r.add(std::move(p));
  };
  // The registry hands out shared_ptr<void> cast back to the op interface: store the interface pointer.
  add("linear.lora", std::shared_ptr<ops::LinearLora>(std::make_shared<NaiveLinearLora>()));
  add("norm_rope", std::shared_ptr<ops::NormRope>(std::make_shared<NaiveNormRope>()));
  add("attention", std::shared_ptr<ops::Attention>(std::make_shared<NaiveAttention>()));
  add("moe.experts", std::shared_ptr<ops::MoeExperts>(std::make_shared<NaiveMoeExperts>()));
  add("moe.mlp", std::shared_ptr<ops::MoeMlp>(std::make_shared<NaiveMoeMlp>()));
  add("rms_norm", std::shared_ptr<ops::RmsNorm>(std::make_shared<NaiveRmsNorm>()));
  add("swiglu", std::shared_ptr<ops::Swiglu>(std::make_shared<NaiveSwiglu>()));
  add("linear_ce", std::shared_ptr<ops::LinearCe>(std::make_shared<NaiveLinearCe>()));
  add("linear_attention", std::shared_ptr<ops::LinearAttention>(std::make_shared<NaiveLinearAttention>()));
  add("causal_conv1d", std::shared_ptr<ops::CausalConv1d>(std::make_shared<NaiveCausalConv1d>()));
}

}  // namespace ax::test
