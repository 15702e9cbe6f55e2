#include "models/ring_attention.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::ops {
std::shared_ptr<Attention> make_reference_attention();  // ops/reference/attention.cpp
}

namespace ax::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptT = std::optional<at::Tensor>;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One attention op call of a block pair: a query chunk of every row against a key chunk of every row, the
// samples' pieces as varlen sequences (host offsets, int32 as the op takes them).
struct BlockCall {
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int64_t max_q = 0, max_k = 0;
  bool causal = false;
  int64_t window = -1;
  void add(int64_t lq, int64_t lk) {  // the next sequence: lq query rows against lk key rows
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(lq));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(lk));
    max_q = std::max(max_q, lq);
    max_k = std::max(max_k, lk);
  }
};

// One call's shapes and the batch's sample offsets: what every block pair's op calls are made of.
struct Geometry {
  ContextSplit split;
  int64_t N = 0, r = 0, B = 0, c = 0, Hq = 0, window = -1;
  double scale = 0;
  std::vector<int64_t> cu;  // the whole batch's cu_seqlens (host)
  at::Device device{at::kCPU};

  // A rank's tokens [B·2c, H, X]: its j-th chunk of every row [B·c, H, X] ...
  at::Tensor chunk(const at::Tensor& t, int64_t j) const {
    return t.reshape({B, 2, c, t.size(1), t.size(2)}).select(1, j).reshape({B * c, t.size(1), t.size(2)});
  }
  // ... and both chunks back to tokens.
  at::Tensor tokens(const at::Tensor& c0, const at::Tensor& c1) const {
    auto rows = [&](const at::Tensor& t) { return t.reshape({B, c, t.size(1), t.size(2)}); };
    return at::stack({rows(c0), rows(c1)}, 1).reshape({B * 2 * c, c0.size(1), c0.size(2)});
  }

  // The op calls of query chunk cq against key chunk ck (row chunk indices), none when the mask hides them all.
  std::vector<BlockCall> calls(int64_t cq, int64_t ck) const {
    if (ck > cq) return {};                               // keys after every query: causal
    if (window >= 0 && (cq - ck) * c - (c - 1) > window)  // every key left of every query's window
      return {};
    const int64_t seq = split.seq;
    if (cq == ck) {  // the chunk's samples, causal within each: the op's plain form
      BlockCall call;
      call.causal = true;
      call.window = window;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t start = b * seq + cq * c, end = start + c;
        int64_t prev = start;
        for (auto it = std::upper_bound(cu.begin(), cu.end(), start); it != cu.end() && *it < end; prev = *it++)
          call.add(*it - prev, *it - prev);
        call.add(end - prev, end - prev);
      }
      return {call};
    }
    // Key chunk ck lies wholly before query chunk cq: no causal mask, and of a row only the sample holding the query
    // chunk's first token can reach back into the key chunk. Its queries (the chunk's first lq rows) see its keys
    // (the key chunk's last lk rows); every other row sees none there. With a window W, query row a sees key row
    // j of the chunk's lk when j >= a + lk - span (span = W - gap): the op's left-only window, bottom-right aligned,
    // of span - lq, once the queries past span (which see no key) are left out; one call per distinct lq.
    const int64_t gap = (cq - ck - 1) * c;  // rows between the chunks
    const int64_t span = window - gap;      // with a window: the query rows that can see the key chunk's last row
    const int64_t reach = window < 0 ? c : std::min(c, span);
    struct Cross {
      int64_t lq = 0, lk = 0, window = -1;
    };
    std::vector<std::optional<Cross>> rows(static_cast<std::size_t>(B));
    std::map<int64_t, BlockCall> by_window;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t qs = b * seq + cq * c, ke = b * seq + (ck + 1) * c;
      const auto it = std::upper_bound(cu.begin(), cu.end(), qs);  // the sample [it[-1], it[0]) holds qs
      const int64_t s0 = it[-1], s1 = it[0];
      if (s0 >= ke) continue;  // starts after the key chunk
      Cross x;
      x.lq = std::min(std::min(s1, qs + c) - qs, reach);
      x.lk = ke - std::max(s0, ke - c);
      x.window = window < 0 ? -1 : span - x.lq;
      rows[static_cast<std::size_t>(b)] = x;
      by_window[x.window].window = x.window;
    }
    std::vector<BlockCall> out;
    for (auto& [w, call] : by_window) {
      for (int64_t b = 0; b < B; ++b) {
        const auto& x = rows[static_cast<std::size_t>(b)];
        const bool here = x && x->window == w;
        const int64_t lq = here ? x->lq : 0, lk = here ? x->lk : 0;
        call.add(0, c - lk);  // keys before the sample's: no query
        call.add(lq, lk);
        call.add(c - lq, 0);  // the row's later queries: no key
      }
      out.push_back(std::move(call));
    }
    return out;
  }

  ops::AttentionArgs args(const BlockCall& call, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    ops::AttentionArgs a;
    a.q = q;
    a.k = k;
    a.v = v;
    a.cu_seqlens = at::tensor(call.cu_q, at::kInt).to(device);
    a.cu_seqlens_k = at::tensor(call.cu_k, at::kInt).to(device);
    a.max_seqlen = call.max_q;
    a.max_seqlen_k = call.max_k;
    a.softmax_scale = scale;
    a.causal = call.causal;
    a.window_left = call.window;
    a.check_values = false;  // made here from checked offsets
    return a;
  }
};

struct RingState : torch::CustomClassHolder {
  Geometry geo;
  std::shared_ptr<ops::Attention> op;
  at::Tensor sinks;  // fp32 [Hq] or undefined
  bool sinks_grad = false;
  std::vector<std::vector<at::Tensor>> saved;  // each forward op call's `saved`, in walk order, for its backward
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

// One op call as the walk hands it out: query chunk j (0, 1) of this rank against key chunk jk of the held block.
struct Block {
  int64_t j, jk;
  ops::AttentionArgs args;
};

// The ring, shared by forward and backward: at step t this rank holds rank (r - t)'s K/V block, which travels on
// while `visit` runs every op call of this rank's query chunks `qc` against it; `after_step` ends each step
// before the next block is waited for. The calls come in the same order in every walk.
void walk(const Geometry& G, const std::vector<at::Tensor>& qc, const at::Tensor& k, const at::Tensor& v,
          const std::function<void(const Block&)>& visit, const std::function<void()>& after_step) {
  std::vector<at::Tensor> held{k, v};
  for (int64_t t = 0; t < G.N; ++t) {
    const int64_t s = (G.r - t + G.N) % G.N;
    std::function<at::Tensor()> next;
    if (t + 1 < G.N) next = G.split.comm->ring_pass_start(pack(held));
    const std::vector<at::Tensor> kc{G.chunk(held[0], 0), G.chunk(held[0], 1)}, vc{G.chunk(held[1], 0), G.chunk(held[1], 1)};
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t jk = 0; jk < 2; ++jk)
        for (const BlockCall& call : G.calls(G.split.chunk_of(G.r, j), G.split.chunk_of(s, jk)))
          visit({j, jk, G.args(call, qc[static_cast<std::size_t>(j)], kc[static_cast<std::size_t>(jk)], vc[static_cast<std::size_t>(jk)])});
    if (after_step) after_step();
    if (next) held = unpack(next(), held);
  }
}

// The online-softmax merge, in fp32, of (out [n, Hq, Dv], lse [Hq, n]) so far with a block's.
void merge(at::Tensor& o, at::Tensor& l, const at::Tensor& ob, const at::Tensor& lb) {
  const at::Tensor ln = at::logaddexp(l, lb), base = finite(ln);
  auto weight = [&](const at::Tensor& x) { return at::exp(x - base).transpose(0, 1).unsqueeze(-1); };  // [n, Hq, 1]
  o = o * weight(l) + ob.to(at::kFloat) * weight(lb);
  l = ln;
}

// What the forward keeps for the backward: this rank's merged out and lse of each query chunk (fp32).
struct RingForward {
  at::Tensor out;                 // [rows·block, Hq, Dv] in q's dtype
  std::vector<at::Tensor> o, l;   // per query chunk j: out [B·c, Hq, Dv] (q's dtype), lse [Hq, B·c] (fp32)
};

RingForward ring_forward(RingState& st, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const Geometry& G = st.geo;
  const auto f32 = q.options().dtype(at::kFloat);
  std::vector<at::Tensor> qc, o, l;
  for (int64_t j = 0; j < 2; ++j) {
    qc.push_back(G.chunk(q, j));
    o.push_back(at::zeros({G.B * G.c, G.Hq, v.size(2)}, f32));
    l.push_back(at::full({G.Hq, G.B * G.c}, kNegInf, f32));
  }
  st.saved.clear();
  walk(G, qc, k.contiguous(), v.contiguous(), [&](const Block& b) {
    ops::AttentionResult res = st.op->forward(b.args);
    merge(o[static_cast<std::size_t>(b.j)], l[static_cast<std::size_t>(b.j)], res.out, res.lse);
    st.saved.push_back(std::move(res.saved));
  }, {});
  RingForward f;
  for (int64_t j = 0; j < 2; ++j) {
    auto& oj = o[static_cast<std::size_t>(j)];
    auto& lj = l[static_cast<std::size_t>(j)];
    if (st.sinks.defined()) {  // the sink joins each row's softmax as one more logit (docs/ops/attention.md)
      const at::Tensor lf = at::logaddexp(lj, st.sinks.unsqueeze(1));
      oj = oj * at::exp(lj - lf).transpose(0, 1).unsqueeze(-1);
      lj = lf;
    }
    f.o.push_back(oj.to(q.scalar_type()));
    f.l.push_back(lj);
  }
  f.out = G.tokens(f.o[0], f.o[1]);
  return f;
}

// The same walk: each call's backward with the merged (out, lse), which makes its P and rowsum(dO ∘ O) those of
// the whole rows (docs/ops/attention.md); dq summed here, dK/dV following their block one pass behind.
RingGrads ring_backward(const RingState& st, const at::Tensor& q, const at::Tensor& kl, const at::Tensor& vl,
                        const std::vector<at::Tensor>& o, const std::vector<at::Tensor>& l, const at::Tensor& grad_out) {
  const Geometry& G = st.geo;
  const at::Tensor dout = grad_out.to(q.scalar_type());
  const auto f32 = q.options().dtype(at::kFloat);
  std::vector<at::Tensor> qc, dOc, dq;
  for (int64_t j = 0; j < 2; ++j) {
    qc.push_back(G.chunk(q, j));
    dOc.push_back(G.chunk(dout, j).contiguous());
    dq.push_back(at::zeros(qc.back().sizes(), f32));
  }
  // The held block's gradient so far (fp32): it follows the block once each step has added to it, and after the
  // last step's pass it has reached the block's owner.
  std::vector<at::Tensor> grad{at::zeros(kl.sizes(), f32), at::zeros(vl.sizes(), f32)};
  std::size_t n = 0;
  walk(G, qc, kl, vl, [&](const Block& b) {
    ops::AttentionBackwardArgs bw;
    bw.grad_out = dOc[static_cast<std::size_t>(b.j)];
    bw.out = o[static_cast<std::size_t>(b.j)];
    bw.lse = l[static_cast<std::size_t>(b.j)];
    bw.saved = st.saved.at(n++);
    const ops::AttentionGrads g = st.op->backward(b.args, bw);
    dq[static_cast<std::size_t>(b.j)].add_(g.dq.to(at::kFloat));
    for (int64_t i = 0; i < 2; ++i) {
      const at::Tensor& d = i == 0 ? g.dk : g.dv;
      at::Tensor& acc = grad[static_cast<std::size_t>(i)];
      acc.view({G.B, 2, G.c, acc.size(1), acc.size(2)}).select(1, b.jk).add_(d.to(at::kFloat).reshape({G.B, G.c, d.size(1), d.size(2)}));
    }
  }, [&] { grad = unpack(G.split.comm->ring_pass(pack(grad)), grad); });
  RingGrads out;
  if (st.sinks_grad) {  // -Σ_i exp(s_h - lse_i) · rowsum(dO_i ∘ O_i) over this rank's rows
    out.dsinks = at::zeros({G.Hq}, f32);
    for (int64_t j = 0; j < 2; ++j) {
      const auto i = static_cast<std::size_t>(j);
      const at::Tensor rowdot = (dOc[i].to(at::kFloat) * o[i].to(at::kFloat)).sum(-1).transpose(0, 1);  // [Hq, n]
      out.dsinks.sub_((at::exp(st.sinks.unsqueeze(1) - l[i]) * rowdot).sum(1));
    }
  }
  out.dq = G.tokens(dq[0], dq[1]).to(q.scalar_type());
  out.dk = grad[0].to(kl.scalar_type());
  out.dv = grad[1].to(vl.scalar_type());
  return out;
}

struct RingFn : torch::autograd::Function<RingFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const OptT& sinks, c10::intrusive_ptr<RingState> st) {
    RingForward f = ring_forward(*st, q.detach(), k.detach(), v.detach());
    ctx->save_for_backward({q, k, v, f.o[0], f.o[1], f.l[0], f.l[1]});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return f.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<RingState>(ctx->saved_data["state"].toCapsule());
    auto s = ctx->get_saved_variables();
    RingGrads g = ring_backward(*st, s[0], s[1].contiguous(), s[2].contiguous(), {s[3], s[4]}, {s[5], s[6]}, grads[0]);
    return {g.dq, g.dk, g.dv, g.dsinks, at::Tensor()};
  }
};

// The checked geometry and state of one call (ring_attention's and ring_attention_grads').
c10::intrusive_ptr<RingState> ring_state(const ContextSplit& split, const ops::AttentionArgs& a, std::shared_ptr<ops::Attention> blocks) {
  const int64_t Tl = split.rows * split.block();
  if (!a.causal) throw UsageError("ring attention: context parallelism splits causal attention only");
  if (a.groups.defined())
    throw UsageError("ring attention: bidirectional attention groups (images) are not split over ranks");
  if (a.cu_seqlens_k.defined())
    throw UsageError("ring attention: keys with their own boundaries (cu_seqlens_k) are not split over ranks");
  if (a.q.dim() != 3 || a.k.dim() != 3 || a.v.dim() != 3 || a.q.size(0) != Tl || a.k.size(0) != Tl ||
      a.v.size(0) != Tl || a.k.size(1) != a.v.size(1) || a.q.size(1) % a.k.size(1) != 0 || a.q.size(2) != a.k.size(2))
    throw RuntimeError(ax::str("ring attention: q ", a.q.sizes(), ", k ", a.k.sizes(), ", v ", a.v.sizes(), " are not ", Tl,
                           " local tokens of GQA heads"));
  auto st = c10::make_intrusive<RingState>();
  st->op = blocks ? std::move(blocks) : ops::make_reference_attention();
  Geometry& G = st->geo;
  G.split = split;
  G.N = split.comm->size();
  G.r = split.comm->rank();
  G.B = split.rows;
  G.c = split.chunk();
  G.Hq = a.q.size(1);
  G.window = a.window_left;
  G.scale = a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(double(a.q.size(2)));
  G.device = a.q.device();
  G.cu = split.boundaries("ring attention");  // the block calls' offsets come from the host table (a.cu_seqlens unread)
  if (a.sinks.defined()) {
    st->sinks = a.sinks.detach().to(at::kFloat);
    st->sinks_grad = a.sinks.requires_grad();
  }
  return st;
}

}  // namespace

at::Tensor ring_attention(const ContextSplit& split, const ops::AttentionArgs& a, std::shared_ptr<ops::Attention> blocks) {
  auto st = ring_state(split, a, std::move(blocks));
  return RingFn::apply(a.q, a.k, a.v, a.sinks.defined() ? OptT(a.sinks) : OptT(), st);
}

RingGrads ring_attention_grads(const ContextSplit& split, const ops::AttentionArgs& a, const at::Tensor& grad_out,
                               std::shared_ptr<ops::Attention> blocks) {
  at::NoGradGuard no_grad;
  auto st = ring_state(split, a, std::move(blocks));
  if (a.sinks.defined()) st->sinks_grad = true;
  const at::Tensor q = a.q.detach(), k = a.k.detach().contiguous(), v = a.v.detach().contiguous();
  RingForward f = ring_forward(*st, q, k, v);
  RingGrads g = ring_backward(*st, q, k, v, f.o, f.l, grad_out);
  g.out = f.out;
  return g;
}

}  // namespace ax::models
