// Reference attention: for each packed sequence and each KV head group, materialise the scores
// S = scale·q kᵀ (fp32), mask, softmax, multiply by v. Memory is O(G·L²) per step (G = query heads per
// KV head): fine for tests and short contexts, the reason real backends exist.
// Backward with P = softmax(S), O = P v, G_o = dO:
//   dV = Pᵀ·dO,  dP = dO·vᵀ,  dS = P∘(dP − rowsum(dO∘O)),  dq = scale·dS·k,  dk = scale·dSᵀ·q
// dk/dv of a KV head sum over its query heads in a fixed order (a plain sum over a dim): deterministic.
#include <cmath>
#include <limits>
#include <memory>

#include "axengine/ops/attention.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

struct Seq {
  int64_t start, len;
};

std::vector<Seq> sequences(const at::Tensor& cu_seqlens) {
  at::Tensor cu = cu_seqlens.to(at::kCPU).to(at::kLong).contiguous();
  std::vector<Seq> out;
  for (int64_t i = 0; i + 1 < cu.numel(); ++i) {
    const int64_t s = cu.data_ptr<int64_t>()[i], e = cu.data_ptr<int64_t>()[i + 1];
    if (e > s) out.push_back({s, e - s});
  }
  return out;
}

double scale_of(const AttentionArgs& a) {
  return a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(a.q.size(2)));
}

// True where key j is hidden from query i: [L, L].
at::Tensor mask(const AttentionArgs& a, int64_t L, const at::Device& dev) {
  at::Tensor i = at::arange(L, at::TensorOptions().dtype(at::kLong).device(dev)).unsqueeze(1);
  at::Tensor j = i.t();
  at::Tensor m = at::zeros({L, L}, at::TensorOptions().dtype(at::kBool).device(dev));
  if (a.causal) m = m | (j > i);
  if (a.window_left >= 0) m = m | (j < i - a.window_left);
  return m;
}

// q: [L, Hq, D] → for KV head h, the query heads h·G..h·G+G-1: [G, L, D]
at::Tensor group(const at::Tensor& t, int64_t h, int64_t G) {
  return t.slice(1, h * G, (h + 1) * G).permute({1, 0, 2});
}

class ReferenceAttention final : public Attention {
 protected:
  AttentionResult run_forward(const AttentionArgs& a) override {
    const auto dt = a.q.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t T = a.q.size(0), Hq = a.q.size(1), Hkv = a.k.size(1), G = Hq / Hkv, Dv = a.v.size(2);
    const double scale = scale_of(a);
    at::Tensor out = at::zeros({T, Hq, Dv}, a.q.options().dtype(ct));
    at::Tensor lse = at::full({Hq, T}, -std::numeric_limits<float>::infinity(), a.q.options().dtype(at::kFloat));
    for (const Seq& s : sequences(a.cu_seqlens)) {
      at::Tensor m = mask(a, s.len, a.q.device());
      at::Tensor q = a.q.slice(0, s.start, s.start + s.len).to(ct);
      at::Tensor k = a.k.slice(0, s.start, s.start + s.len).to(ct);
      at::Tensor v = a.v.slice(0, s.start, s.start + s.len).to(ct);
      for (int64_t h = 0; h < Hkv; ++h) {
        at::Tensor kh = k.select(1, h), vh = v.select(1, h);                          // [L, D], [L, Dv]
        at::Tensor scores = at::matmul(group(q, h, G), kh.t()) * scale;              // [G, L, L]
        scores = scores.masked_fill(m, -std::numeric_limits<double>::infinity());
        at::Tensor l = at::logsumexp(scores, -1, /*keepdim=*/true);                  // [G, L, 1]
        at::Tensor o = at::matmul(at::exp(scores - l), vh);                          // [G, L, Dv]
        out.slice(0, s.start, s.start + s.len).slice(1, h * G, (h + 1) * G).copy_(o.permute({1, 0, 2}));
        lse.slice(0, h * G, (h + 1) * G).slice(1, s.start, s.start + s.len).copy_(l.squeeze(-1));
      }
    }
    AttentionResult r;
    r.out = ref::emit(out, dt, a.out);
    r.lse = lse;
    return r;
  }

  AttentionGrads run_backward(const AttentionArgs& a, const AttentionBackwardArgs& b) override {
    const auto dt = a.q.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t Hq = a.q.size(1), Hkv = a.k.size(1), G = Hq / Hkv;
    const double scale = scale_of(a);
    at::Tensor dq = at::zeros(a.q.sizes(), a.q.options().dtype(ct));
    at::Tensor dk = at::zeros(a.k.sizes(), a.q.options().dtype(ct));
    at::Tensor dv = at::zeros(a.v.sizes(), a.q.options().dtype(ct));
    for (const Seq& s : sequences(a.cu_seqlens)) {
      at::Tensor m = mask(a, s.len, a.q.device());
      auto rows = [&](const at::Tensor& t) { return t.slice(0, s.start, s.start + s.len); };
      at::Tensor q = rows(a.q).to(ct), k = rows(a.k).to(ct), v = rows(a.v).to(ct), go = rows(b.grad_out).to(ct);
      for (int64_t h = 0; h < Hkv; ++h) {
        at::Tensor qg = group(q, h, G), gog = group(go, h, G);                       // [G, L, D], [G, L, Dv]
        at::Tensor kh = k.select(1, h), vh = v.select(1, h);
        at::Tensor scores = (at::matmul(qg, kh.t()) * scale).masked_fill(m, -std::numeric_limits<double>::infinity());
        at::Tensor p = at::softmax(scores, -1);                                      // [G, L, L]
        at::Tensor o = at::matmul(p, vh);
        at::Tensor dp = at::matmul(gog, vh.t());
        at::Tensor ds = p * (dp - (gog * o).sum(-1, /*keepdim=*/true));
        rows(dq).slice(1, h * G, (h + 1) * G).copy_((at::matmul(ds, kh) * scale).permute({1, 0, 2}));
        rows(dk).select(1, h).copy_((at::matmul(ds.transpose(1, 2), qg) * scale).sum(0));
        rows(dv).select(1, h).copy_(at::matmul(p.transpose(1, 2), gog).sum(0));
      }
    }
    AttentionGrads g;
    g.dq = ref::emit(dq, dt, b.grads_out.dq);
    g.dk = ref::emit(dk, dt, b.grads_out.dk);
    g.dv = ref::emit(dv, dt, b.grads_out.dv);
    return g;
  }
};

}  // namespace

std::shared_ptr<Attention> make_reference_attention() { return std::make_shared<ReferenceAttention>(); }

}  // namespace ax::ops
