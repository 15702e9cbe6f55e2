// Reference linear_attention: the gated delta rule itself, one row at a time, in fp32 (fp64 for fp64
// inputs), each output rounded once. Per sequence and all value heads at once, S [Hv, Dk, Dv]:
//   S_d = exp(g_t) · S_{t-1}                 the decayed state
//   u_t = v_t − S_dᵀ k_t                      what the state does not yet predict
//   S_t = S_d + k_t (β_t u_t)ᵀ                the delta-rule write
//   o_t = S_tᵀ q_t                            q_t already L2-normalised (qk_l2norm) and scaled
// Backward walks the rows in reverse with dS = ∂L/∂S_t (from grad_final_state, or 0):
//   dS += q_t do_tᵀ;  dq_t = S_t do_t;  dδ = dSᵀ k_t (δ = β_t u_t);  dk_t = dS δ
//   dv_t = β_t dδ;  dβ_t = Σ dδ·u_t;  dS_d = dS − k_t dv_tᵀ;  dk_t −= S_d dv_t
//   dg_t = exp(g_t) Σ S_{t-1}·dS_d;  dS ← exp(g_t) dS_d        (= d initial_state at the sequence start)
// then through the head repeat (a sum over each group), the scale and the L2 norm
//   dx = rstd · (dx̂ − x̂ (x̂·dx̂)),  x̂ = x · rstd,  rstd = 1/sqrt(Σx² + eps).
// Backward needs S_{t-1} at every row: the forward is replayed per sequence keeping the state every
// kSegment rows, and each segment's states are rebuilt from its checkpoint when the reverse walk reaches it
// (memory O(T/kSegment + kSegment) states, not O(T)). cu_seqlens is read on the host: not graph-safe.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "axengine/ops/linear_attention.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

constexpr int64_t kSegment = 64;

// q, k, v, g, beta in the compute type with q/k normalised (when asked), q scaled and both repeated to the
// Hv value heads: [T, Hv, D].
struct Rows {
  at::Tensor qhat, khat;  // [T, Hk, Dk] normalised (or as given), unscaled
  at::Tensor rq, rk;      // [T, Hk, 1] the L2 norms' rstd (undefined without qk_l2norm)
  at::Tensor q, k, v, g, beta;
  double scale;
};

double scale_of(const LinearAttentionArgs& a) {
  return a.scale > 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(a.q.size(2)));
}

Rows prepare(const LinearAttentionArgs& a, at::ScalarType ct) {
  Rows r;
  r.scale = scale_of(a);
  r.qhat = a.q.to(ct);
  r.khat = a.k.to(ct);
  if (a.qk_l2norm) {
    r.rq = at::rsqrt(r.qhat.pow(2).sum(-1, /*keepdim=*/true) + kLinearAttentionL2Eps);
    r.rk = at::rsqrt(r.khat.pow(2).sum(-1, /*keepdim=*/true) + kLinearAttentionL2Eps);
    r.qhat = r.qhat * r.rq;
    r.khat = r.khat * r.rk;
  }
  const int64_t group = a.v.size(1) / a.q.size(1);
  r.q = r.qhat.repeat_interleave(group, 1) * r.scale;
  r.k = r.khat.repeat_interleave(group, 1);
  r.v = a.v.to(ct);
  r.g = a.g.to(ct);
  r.beta = a.beta.to(ct);
  return r;
}

std::vector<int64_t> offsets(const LinearAttentionArgs& a) {
  at::Tensor cu = a.cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  return {cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel()};
}

at::Tensor start_state(const LinearAttentionArgs& a, int64_t b, at::ScalarType ct) {
  if (a.initial_state.defined()) return a.initial_state[b].to(ct);
  return at::zeros({a.v.size(1), a.k.size(2), a.v.size(2)}, a.v.options().dtype(ct));
}

// One row: the state after it, and the decayed state and the residual it was made from.
struct Step {
  at::Tensor s, sd, u;
};

Step step(const Rows& r, int64_t t, const at::Tensor& s_prev) {
  Step o;
  o.sd = s_prev * r.g[t].exp().view({-1, 1, 1});
  o.u = r.v[t] - (o.sd * r.k[t].unsqueeze(2)).sum(1);                           // [Hv, Dv]
  o.s = o.sd + r.k[t].unsqueeze(2) * (r.beta[t].unsqueeze(1) * o.u).unsqueeze(1);  // k (β u)ᵀ
  return o;
}

// o_t = S_tᵀ q_t: [Hv, Dv]
at::Tensor read(const Rows& r, int64_t t, const at::Tensor& s) { return (s * r.q[t].unsqueeze(2)).sum(1); }

// dx from dx̂ through x̂ = x·rstd (or dx̂ itself without the norm).
at::Tensor through_l2norm(const at::Tensor& dxhat, const at::Tensor& xhat, const at::Tensor& rstd) {
  if (!rstd.defined()) return dxhat;
  return rstd * (dxhat - xhat * (xhat * dxhat).sum(-1, /*keepdim=*/true));
}

class ReferenceLinearAttention final : public LinearAttention {
 protected:
  LinearAttentionResult run_forward(const LinearAttentionArgs& a) override {
    const auto dt = a.q.scalar_type();
    const auto ct = ref::compute_type(dt);
    const Rows r = prepare(a, ct);
    const std::vector<int64_t> cu = offsets(a);
    const int64_t N = static_cast<int64_t>(cu.size()) - 1;
    at::Tensor out = at::zeros(a.v.sizes(), a.v.options().dtype(ct));
    at::Tensor final_state;
    if (a.output_final_state) final_state = at::empty({N, a.v.size(1), a.k.size(2), a.v.size(2)}, a.v.options().dtype(ct));
    for (int64_t b = 0; b < N; ++b) {
      at::Tensor s = start_state(a, b, ct);
      for (int64_t t = cu[b]; t < cu[b + 1]; ++t) {
        s = step(r, t, s).s;
        out[t] = read(r, t, s);
      }
      if (final_state.defined()) final_state[b] = s;
    }
    return {ref::emit(out, dt, a.out), final_state, {}};
  }

  LinearAttentionGrads run_backward(const LinearAttentionArgs& a, const LinearAttentionBackwardArgs& bw) override {
    const auto dt = a.q.scalar_type();
    const auto ct = ref::compute_type(dt);
    const Rows r = prepare(a, ct);
    const std::vector<int64_t> cu = offsets(a);
    const int64_t N = static_cast<int64_t>(cu.size()) - 1;
    const int64_t T = a.q.size(0), Hk = a.q.size(1), Hv = a.v.size(1), Dk = a.q.size(2);
    at::Tensor grad = bw.grad_out.to(ct);
    at::Tensor dq = at::zeros({T, Hv, Dk}, r.q.options()), dk = at::zeros({T, Hv, Dk}, r.q.options());
    at::Tensor dv = at::zeros_like(r.v), dg = at::zeros_like(r.g), dbeta = at::zeros_like(r.beta);
    at::Tensor dinit;
    if (a.initial_state.defined()) dinit = at::empty(a.initial_state.sizes(), a.initial_state.options().dtype(ct));

    for (int64_t b = 0; b < N; ++b) {
      const int64_t r0 = cu[b], r1 = cu[b + 1];
      // The state entering every kSegment-th row.
      std::vector<at::Tensor> checkpoints;
      at::Tensor s = start_state(a, b, ct);
      for (int64_t t = r0; t < r1; ++t) {
        if ((t - r0) % kSegment == 0) checkpoints.push_back(s);
        s = step(r, t, s).s;
      }
      at::Tensor ds = bw.grad_final_state.defined() ? bw.grad_final_state[b].to(ct) : at::zeros_like(s);
      for (int64_t c = static_cast<int64_t>(checkpoints.size()) - 1; c >= 0; --c) {
        const int64_t t0 = r0 + c * kSegment, t1 = std::min(r1, t0 + kSegment);
        // steps[i]: row t0 + i rebuilt from the checkpoint; the state entering it is the previous step's.
        std::vector<Step> steps;
        for (int64_t t = t0; t < t1; ++t) steps.push_back(step(r, t, steps.empty() ? checkpoints[c] : steps.back().s));
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const Step& st = steps[t - t0];
          const at::Tensor& s_prev = t > t0 ? steps[t - t0 - 1].s : checkpoints[c];
          const at::Tensor go = grad[t];                                   // [Hv, Dv]
          ds = ds + r.q[t].unsqueeze(2) * go.unsqueeze(1);                 // from o_t = S_tᵀ q_t
          dq[t] = (st.s * go.unsqueeze(1)).sum(2);
          const at::Tensor delta = r.beta[t].unsqueeze(1) * st.u;           // [Hv, Dv]
          const at::Tensor ddelta = (ds * r.k[t].unsqueeze(2)).sum(1);      // dSᵀ k
          at::Tensor dkt = (ds * delta.unsqueeze(1)).sum(2);                // dS δ
          const at::Tensor du = r.beta[t].unsqueeze(1) * ddelta;
          dv[t] = du;
          dbeta[t] = (ddelta * st.u).sum(-1);
          // u = v − S_dᵀ k: dS_d gets −k duᵀ, dk gets −S_d du
          const at::Tensor dsd = ds - r.k[t].unsqueeze(2) * du.unsqueeze(1);
          dkt = dkt - (st.sd * du.unsqueeze(1)).sum(2);
          dk[t] = dkt;
          const at::Tensor decay = r.g[t].exp();                           // [Hv]
          dg[t] = decay * (s_prev * dsd).sum({1, 2});
          ds = dsd * decay.view({-1, 1, 1});
        }
      }
      if (dinit.defined()) dinit[b] = ds;
    }

    // Back through the head repeat (value heads h·G .. h·G+G-1 read key head h), the scale and the norm.
    const int64_t group = Hv / Hk;
    at::Tensor dqhat = dq.view({T, Hk, group, Dk}).sum(2) * r.scale;
    at::Tensor dkhat = dk.view({T, Hk, group, Dk}).sum(2);
    LinearAttentionGrads out;
    out.dq = through_l2norm(dqhat, r.qhat, r.rq).to(dt);
    out.dk = through_l2norm(dkhat, r.khat, r.rk).to(dt);
    out.dv = dv.to(dt);
    out.dg = dg.to(a.g.scalar_type());
    out.dbeta = dbeta.to(dt);
    if (dinit.defined()) out.dinitial_state = dinit.to(a.initial_state.scalar_type());
    return out;
  }
};

}  // namespace

std::shared_ptr<LinearAttention> make_reference_linear_attention() { return std::make_shared<ReferenceLinearAttention>(); }

}  // namespace ax::ops
