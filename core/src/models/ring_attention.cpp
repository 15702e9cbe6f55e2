#include "models/ring_attention.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptT = std::optional<at::Tensor>;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Scores of one block piece held at once: B·Hq·rows·keys fp32 values (256 MiB); longer blocks go in query pieces.
constexpr int64_t kScoreBudget = int64_t(1) << 26;

// One call's shapes, and each token's sample: what the masks of every block pair are made of.
struct Geometry {
  ContextSplit split;
  int64_t N = 0, r = 0, B = 0, c = 0, Hq = 0, Hkv = 0, g = 0, D = 0, Dv = 0, window = -1, piece = 0;
  double scale = 0;
  at::Tensor sample;  // int64 [B, 2N, c]: the index of each token's sample in cu_seqlens

  // Query chunk cq against key chunk ck of the same rows: [B, 1, 1, c, c] true where a query sees a key (same
  // sample, not later, within the window), or undefined when no query of the pair can see any key.
  at::Tensor mask(int64_t cq, int64_t ck) const {
    if (ck > cq) return {};                               // keys after every query: causal
    if (window >= 0 && (cq - ck) * c - (c - 1) > window)  // every key left of every query's window
      return {};
    const auto opts = sample.options();
    at::Tensor d = at::arange(c, opts).unsqueeze(1) - at::arange(c, opts).unsqueeze(0) + (cq - ck) * c;  // q - k
    at::Tensor ok = d.ge(0);
    if (window >= 0) ok = ok.logical_and(d.le(window));
    at::Tensor same = sample.select(1, cq).unsqueeze(2).eq(sample.select(1, ck).unsqueeze(1));  // [B, c, c]
    return same.logical_and(ok).view({B, 1, 1, c, c});
  }
  // A rank's [B·2c, H, X] tokens: its j-th chunk of every row as query heads [B, Hkv, g, c, X] (fp32) ...
  at::Tensor query_heads(const at::Tensor& t, int64_t j) const {
    const int64_t X = t.size(-1);
    return t.reshape({B, 2, c, Hkv, g, X}).select(1, j).to(at::kFloat).permute({0, 2, 3, 1, 4});
  }
  // ... or as key heads [B, Hkv, 1, c, X] (fp32).
  at::Tensor key_heads(const at::Tensor& t, int64_t j) const {
    return t.reshape({B, 2, c, Hkv, t.size(-1)}).select(1, j).to(at::kFloat).permute({0, 2, 1, 3}).unsqueeze(2);
  }
  // Query heads of both chunks back to tokens [B·2c, Hq, X].
  at::Tensor tokens(const at::Tensor& h0, const at::Tensor& h1) const {
    auto back = [&](const at::Tensor& h) { return h.permute({0, 3, 1, 2, 4}).reshape({B, c, Hq, h.size(-1)}); };
    return at::stack({back(h0), back(h1)}, 1).reshape({B * 2 * c, Hq, h0.size(-1)});
  }
};

struct RingState : torch::CustomClassHolder {
  Geometry geo;
  at::Tensor sinks;  // fp32 [Hq] or undefined
  bool sinks_grad = false;
};

at::Tensor finite(const at::Tensor& lse) { return lse.masked_fill(lse.isneginf(), 0.0); }

// Several tensors as one byte buffer (one ring step sends one tensor), and back (fresh storage: aligned).
at::Tensor pack(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> bytes;
  for (const auto& t : ts) bytes.push_back(t.contiguous().view({-1}).view(at::kByte));
  return at::cat(bytes);
}
std::vector<at::Tensor> unpack(const at::Tensor& buf, const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> out;
  int64_t off = 0;
  for (const auto& t : like) {
    const int64_t n = t.numel() * static_cast<int64_t>(t.element_size());
    out.push_back(buf.narrow(0, off, n).clone().view(t.scalar_type()).view(t.sizes()));
    off += n;
  }
  return out;
}

// The scaled, masked scores of query heads q [B, Hkv, g, n, D] against key heads k [B, Hkv, 1, ck, D].
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, double scale) {
  return at::matmul(q, k.transpose(-1, -2)).mul_(scale).masked_fill_(mask.logical_not(), kNegInf);
}

// Each query piece [p0, p0 + n) of a chunk of c queries.
template <class F>
void pieces(const Geometry& G, F&& f) {
  for (int64_t p0 = 0; p0 < G.c; p0 += G.piece) f(p0, std::min(G.piece, G.c - p0));
}

struct RingFn : torch::autograd::Function<RingFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const OptT& sinks, c10::intrusive_ptr<RingState> st) {
    const Geometry& G = st->geo;
    const at::Tensor kl = k.detach().contiguous(), vl = v.detach().contiguous();
    const auto f32 = q.options().dtype(at::kFloat);
    std::vector<at::Tensor> qh, o, l;
    for (int64_t j = 0; j < 2; ++j) {
      qh.push_back(G.query_heads(q.detach(), j));
      o.push_back(at::zeros({G.B, G.Hkv, G.g, G.c, G.Dv}, f32));
      l.push_back(at::full({G.B, G.Hkv, G.g, G.c}, kNegInf, f32));
    }
    std::vector<at::Tensor> held{kl, vl};  // the block of rank s = r - t at step t
    for (int64_t t = 0; t < G.N; ++t) {
      const int64_t s = (G.r - t + G.N) % G.N;
      // The held block travels on while this step computes on it.
      std::function<at::Tensor()> next;
      if (t + 1 < G.N) next = G.split.comm->ring_pass_start(pack(held));
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t jk = 0; jk < 2; ++jk) {
          const at::Tensor m = G.mask(G.split.chunk_of(G.r, j), G.split.chunk_of(s, jk));
          if (!m.defined()) continue;
          const at::Tensor kh = G.key_heads(held[0], jk), vh = G.key_heads(held[1], jk);
          pieces(G, [&](int64_t p0, int64_t n) {
            at::Tensor sc = scores(qh[j].narrow(3, p0, n), kh, m.narrow(3, p0, n), G.scale);
            at::Tensor lb = at::logsumexp(sc, -1);
            at::Tensor ob = at::matmul(at::exp(sc - finite(lb).unsqueeze(-1)), vh);
            // The online-softmax merge of (out, lse) so far with this block's.
            at::Tensor lo = l[j].narrow(3, p0, n), oo = o[j].narrow(3, p0, n);
            at::Tensor ln = at::logaddexp(lo, lb), base = finite(ln).unsqueeze(-1);
            oo.copy_(oo * at::exp(lo.unsqueeze(-1) - base) + ob * at::exp(lb.unsqueeze(-1) - base));
            lo.copy_(ln);
          });
        }
      if (next) held = unpack(next(), held);
    }
    if (st->sinks.defined()) {  // the sink joins each row's softmax as one more logit (docs/ops/attention.md)
      const at::Tensor sink = st->sinks.view({1, G.Hkv, G.g, 1});
      for (int64_t j = 0; j < 2; ++j) {
        at::Tensor lf = at::logaddexp(l[j], sink);
        o[j] = o[j] * at::exp(l[j] - lf).unsqueeze(-1);
        l[j] = lf;
      }
    }
    ctx->save_for_backward({q, k, v, o[0], o[1], l[0], l[1]});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return G.tokens(o[0], o[1]).to(q.scalar_type());
  }

  // The op's backward formulas (docs/ops/attention.md) block by block, P from the final lse.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<RingState>(ctx->saved_data["state"].toCapsule());
    const Geometry& G = st->geo;
    auto saved = ctx->get_saved_variables();
    const at::Tensor q = saved[0], kl = saved[1].contiguous(), vl = saved[2].contiguous();
    const std::vector<at::Tensor> o{saved[3], saved[4]}, l{saved[5], saved[6]};
    const at::Tensor dout = grads[0].contiguous();
    std::vector<at::Tensor> qh, dOh, Dd, dq;
    for (int64_t j = 0; j < 2; ++j) {
      qh.push_back(G.query_heads(q, j));
      dOh.push_back(G.query_heads(dout, j));
      Dd.push_back((dOh[j] * o[j]).sum(-1));  // rowsum(dO ∘ O)
      dq.push_back(at::zeros_like(qh[j]));
    }
    const auto f32 = q.options().dtype(at::kFloat);
    // The held block and its gradient so far (fp32), which follow it: the block travels on while this step
    // computes on it, the gradient once this step has added to it.
    std::vector<at::Tensor> held{kl, vl}, grad{at::zeros(kl.sizes(), f32), at::zeros(vl.sizes(), f32)};
    for (int64_t t = 0; t < G.N; ++t) {
      const int64_t s = (G.r - t + G.N) % G.N;
      std::function<at::Tensor()> next;
      if (t + 1 < G.N) next = G.split.comm->ring_pass_start(pack(held));
      const at::Tensor dk = grad[0].view({G.B, 2, G.c, G.Hkv, G.D}), dv = grad[1].view({G.B, 2, G.c, G.Hkv, G.Dv});
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t jk = 0; jk < 2; ++jk) {
          const at::Tensor m = G.mask(G.split.chunk_of(G.r, j), G.split.chunk_of(s, jk));
          if (!m.defined()) continue;
          const at::Tensor kh = G.key_heads(held[0], jk), vh = G.key_heads(held[1], jk);
          pieces(G, [&](int64_t p0, int64_t n) {
            const at::Tensor qp = qh[j].narrow(3, p0, n), dop = dOh[j].narrow(3, p0, n);
            at::Tensor p = at::exp(scores(qp, kh, m.narrow(3, p0, n), G.scale) - l[j].narrow(3, p0, n).unsqueeze(-1));
            dv.select(1, jk).add_(at::matmul(p.transpose(-1, -2), dop).sum(2).permute({0, 2, 1, 3}));
            at::Tensor ds = p * (at::matmul(dop, vh.transpose(-1, -2)) - Dd[j].narrow(3, p0, n).unsqueeze(-1));
            dq[j].narrow(3, p0, n).add_(at::matmul(ds, kh), G.scale);
            dk.select(1, jk).add_(at::matmul(ds.transpose(-1, -2), qp).sum(2).permute({0, 2, 1, 3}), G.scale);
          });
        }
      // After the last step's pass the gradient has reached its block's owner.
      grad = unpack(G.split.comm->ring_pass(pack(grad)), grad);
      if (next) held = unpack(next(), held);
    }
    at::Tensor dsinks;
    if (st->sinks_grad) {  // -Σ_i exp(s_h - lse_i) · rowsum(dO_i ∘ O_i) over this rank's rows
      const at::Tensor sink = st->sinks.view({1, G.Hkv, G.g, 1});
      const std::vector<int64_t> rows{0, 3};  // batch rows and tokens
      dsinks = -((at::exp(sink - l[0]) * Dd[0]).sum(rows) + (at::exp(sink - l[1]) * Dd[1]).sum(rows)).reshape({G.Hq});
    }
    return {G.tokens(dq[0], dq[1]).to(q.scalar_type()), grad[0].to(kl.scalar_type()), grad[1].to(vl.scalar_type()),
            dsinks, at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const ContextSplit& split, const ops::AttentionArgs& a) {
  const int64_t Tl = split.rows * split.block();
  if (!a.causal) throw UsageError("ring attention: context parallelism splits causal attention only");
  if (a.groups.defined())
    throw UsageError("ring attention: bidirectional attention groups (images) are not split over ranks");
  if (a.q.dim() != 3 || a.k.dim() != 3 || a.v.dim() != 3 || a.q.size(0) != Tl || a.k.size(0) != Tl ||
      a.v.size(0) != Tl || a.k.size(1) != a.v.size(1) || a.q.size(1) % a.k.size(1) != 0 || a.q.size(2) != a.k.size(2))
    throw RuntimeError(ax::str("ring attention: q ", a.q.sizes(), ", k ", a.k.sizes(), ", v ", a.v.sizes(), " are not ", Tl,
                           " local tokens of GQA heads"));
  auto st = c10::make_intrusive<RingState>();
  Geometry& G = st->geo;
  G.split = split;
  G.N = split.comm->size();
  G.r = split.comm->rank();
  G.B = split.rows;
  G.c = split.chunk();
  G.Hq = a.q.size(1);
  G.Hkv = a.k.size(1);
  G.g = G.Hq / G.Hkv;
  G.D = a.q.size(2);
  G.Dv = a.v.size(2);
  G.window = a.window_left;
  G.scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(double(G.D));
  G.piece = std::max<int64_t>(1, kScoreBudget / std::max<int64_t>(1, G.B * G.Hq * G.c));
  // Token t of the batch is in sample b when cu[b] <= t < cu[b+1]: the count of cu[1:] entries <= t.
  const at::Tensor cu = a.cu_seqlens.to(a.q.device(), at::kLong);
  const at::Tensor all = at::arange(split.rows * split.seq, cu.options());
  G.sample = at::searchsorted(cu.narrow(0, 1, cu.size(0) - 1), all, false, true).view({G.B, 2 * G.N, G.c});
  OptT sinks;
  if (a.sinks.defined()) {
    st->sinks = a.sinks.detach().to(at::kFloat);
    st->sinks_grad = a.sinks.requires_grad();
    sinks = a.sinks;
  }
  return RingFn::apply(a.q, a.k, a.v, sinks, st);
}

}  // namespace ax::models
