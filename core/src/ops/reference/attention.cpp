// Reference attention: materialise the scores S = scale·q kᵀ (fp32, fp64 for fp64 input), mask, softmax,
// multiply by v. Packed sequences are handled with a mask, not a loop: query rows are taken in chunks,
// each against the key rows any of its queries can see (at most max_seqlen − 1 rows back, and forward
// too when not causal), and a key is visible when it lies in the query's sequence (segment ids from
// cu_seqlens on the device). So a packed batch of hundreds of short samples costs a handful of batched
// matmuls and no host synchronisation; memory is O(Hq · chunk · (chunk + max_seqlen)), bounded below.
// Backward with P = softmax(S), O = P v, G_o = dO:
//   dV = Pᵀ·dO,  dP = dO·vᵀ,  dS = P∘(dP − rowsum(dO∘O)),  dq = scale·dS·k,  dk = scale·dSᵀ·q
// dk/dv of a KV head sum over its query heads and over query chunks in a fixed order: deterministic.
// Bidirectional groups only unmask keys: the same mask formulas, with later keys of the query's group visible.
// Sinks (a per-head logit s_h in every row's softmax, then dropped): lse_f = logaddexp(lse, s_h) and
// P = exp(S − lse_f), so rows of P sum to 1 − exp(s_h − lse_f). The formulas above hold with this P (O is
// still P v, and ∂lse_f/∂S_ij = P_ij); and since ∂O_i/∂s_h = −exp(s_h − lse_f_i)·O_i,
//   dsink_h = −Σ_i exp(s_h − lse_f_i) · rowsum(dO_i ∘ O_i)   over the rows of head h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "axengine/ops/attention.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

double scale_of(const AttentionArgs& a) {
  return a.softmax_scale > 0 ? a.softmax_scale : 1.0 / std::sqrt(static_cast<double>(a.q.size(2)));
}

int64_t longest(const AttentionArgs& a) {
  if (a.max_seqlen > 0) return a.max_seqlen;
  at::Tensor cu = a.cu_seqlens.to(at::kCPU, at::kLong);  // contract: 0 means "derive it" (a sync)
  return cu.numel() < 2 ? 0 : (cu.narrow(0, 1, cu.numel() - 1) - cu.narrow(0, 0, cu.numel() - 1)).max().item<int64_t>();
}

// One chunk of query rows [q0, q1) and the key rows [k0, k1) its queries may see.
struct Chunk {
  int64_t q0, q1, k0, k1;
};

std::vector<Chunk> chunks(const AttentionArgs& a, int64_t T, int64_t L) {
  const int64_t Hq = a.q.size(1);
  const int64_t back = std::max<int64_t>(L - 1, 0);
  const int64_t ahead = a.causal && !a.groups.defined() ? 0 : back;  // a group's later rows are visible
  // Queries per chunk: keep the fp32 score block near 2^25 elements (128 MiB) but never below 64 rows.
  const int64_t budget = int64_t{1} << 25;
  int64_t c = 64;
  while (c < T && Hq * (2 * c) * (2 * c + back + ahead) <= budget) c *= 2;
  std::vector<Chunk> out;
  for (int64_t q0 = 0; q0 < T; q0 += c) {
    const int64_t q1 = std::min(T, q0 + c);
    out.push_back({q0, q1, std::max<int64_t>(0, q0 - back), std::min(T, q1 + ahead)});
  }
  return out;
}

// Sequence index of every row, from cu_seqlens (int64 [T], on the device).
at::Tensor segment_ids(const AttentionArgs& a, int64_t T) {
  at::Tensor rows = at::arange(T, a.cu_seqlens.options().dtype(at::kLong));
  return at::searchsorted(a.cu_seqlens.to(at::kLong), rows, /*out_int32=*/false, /*right=*/true) - 1;
}

// True where key j (absolute row k0 + col) is hidden from query i (row q0 + row): [C, S].
at::Tensor hidden(const AttentionArgs& a, const at::Tensor& seg, const Chunk& c) {
  at::Tensor qi = at::arange(c.q0, c.q1, seg.options()).unsqueeze(1);
  at::Tensor kj = at::arange(c.k0, c.k1, seg.options()).unsqueeze(0);
  at::Tensor m = seg.slice(0, c.q0, c.q1).unsqueeze(1) != seg.slice(0, c.k0, c.k1).unsqueeze(0);
  if (a.causal) {
    at::Tensor future = kj > qi;
    if (a.groups.defined()) {  // a key of the query's own group is visible whatever its position
      at::Tensor gq = a.groups.slice(0, c.q0, c.q1).unsqueeze(1), gk = a.groups.slice(0, c.k0, c.k1).unsqueeze(0);
      future = future & ((gq != gk) | (gq < 0));
    }
    m = m | future;
  }
  if (a.window_left >= 0) m = m | (kj < qi - a.window_left);
  return m;
}

// [rows, H, D] → [Hkv, G·rows, D] (query heads of a KV group next to each other), compute dtype.
at::Tensor by_group(const at::Tensor& t, int64_t Hkv, at::ScalarType ct) {
  const int64_t n = t.size(0), H = t.size(1), D = t.size(2);
  return t.to(ct).permute({1, 0, 2}).reshape({Hkv, (H / Hkv) * n, D});
}
// Inverse of by_group for query-shaped results: [Hkv, G·rows, D] → [rows, Hq, D].
at::Tensor from_group(const at::Tensor& t, int64_t Hq, int64_t rows) {
  return t.reshape({Hq, rows, t.size(2)}).permute({1, 0, 2});
}

// Scores of a chunk, masked: [Hkv, G·C, S].
at::Tensor scores(const AttentionArgs& a, const at::Tensor& qg, const at::Tensor& kg, const at::Tensor& hide,
                  int64_t Hkv, double scale) {
  at::Tensor s = at::matmul(qg, kg.transpose(1, 2)) * scale;
  const int64_t G = qg.size(1) / hide.size(0);
  s = s.view({Hkv, G, hide.size(0), hide.size(1)}).masked_fill(hide, -std::numeric_limits<double>::infinity());
  return s.view({Hkv, G * hide.size(0), hide.size(1)});
}

// The sinks of a chunk's rows in by_group order ([Hkv, G·C, 1], head h = kv·G + g), compute dtype.
at::Tensor sink_rows(const at::Tensor& sinks, int64_t Hkv, int64_t C, at::ScalarType ct) {
  const int64_t G = sinks.size(0) / Hkv;
  return sinks.to(ct).view({Hkv, G, 1}).expand({Hkv, G, C}).reshape({Hkv, G * C, 1});
}

// Log-sum-exp of a chunk's rows, the sinks joined when there are any: [Hkv, G·C, 1].
at::Tensor row_lse(const AttentionArgs& a, const at::Tensor& s, int64_t Hkv, int64_t C, at::ScalarType ct) {
  at::Tensor l = at::logsumexp(s, -1, /*keepdim=*/true);
  return a.sinks.defined() ? at::logaddexp(l, sink_rows(a.sinks, Hkv, C, ct)) : l;
}

class ReferenceAttention final : public Attention {
 protected:
  AttentionResult run_forward(const AttentionArgs& a) override {
    const auto dt = a.q.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t T = a.q.size(0), Hq = a.q.size(1), Hkv = a.k.size(1), Dv = a.v.size(2);
    const double scale = scale_of(a);
    at::Tensor out = at::empty({T, Hq, Dv}, a.q.options().dtype(ct));
    at::Tensor lse = at::empty({Hq, T}, a.q.options().dtype(at::kFloat));
    if (T == 0) return {ref::emit(out, dt, a.out), lse, {}};
    const at::Tensor seg = segment_ids(a, T);
    for (const Chunk& c : chunks(a, T, longest(a))) {
      const int64_t C = c.q1 - c.q0;
      at::Tensor s = scores(a, by_group(a.q.slice(0, c.q0, c.q1), Hkv, ct), by_group(a.k.slice(0, c.k0, c.k1), Hkv, ct),
                            hidden(a, seg, c), Hkv, scale);
      at::Tensor l = row_lse(a, s, Hkv, C, ct);                                     // [Hkv, G·C, 1]
      at::Tensor o = at::matmul(at::exp(s - l), by_group(a.v.slice(0, c.k0, c.k1), Hkv, ct));
      out.slice(0, c.q0, c.q1).copy_(from_group(o, Hq, C));
      lse.slice(1, c.q0, c.q1).copy_(l.reshape({Hq, C}));
    }
    return {ref::emit(out, dt, a.out), lse, {}};
  }

  AttentionGrads run_backward(const AttentionArgs& a, const AttentionBackwardArgs& b) override {
    const auto dt = a.q.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t T = a.q.size(0), Hq = a.q.size(1), Hkv = a.k.size(1);
    const double scale = scale_of(a);
    at::Tensor dq = at::zeros(a.q.sizes(), a.q.options().dtype(ct));
    at::Tensor dk = at::zeros(a.k.sizes(), a.q.options().dtype(ct));
    at::Tensor dv = at::zeros(a.v.sizes(), a.q.options().dtype(ct));
    // dsinks accumulate per head over the chunks, in fp32 at least (the contract's dtype is fp32).
    const auto st = ct == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor dsinks = a.sinks.defined() ? at::zeros({Hq}, a.q.options().dtype(st)) : at::Tensor();
    if (T > 0) {
      const at::Tensor seg = segment_ids(a, T);
      for (const Chunk& c : chunks(a, T, longest(a))) {
        const int64_t C = c.q1 - c.q0;
        at::Tensor qg = by_group(a.q.slice(0, c.q0, c.q1), Hkv, ct);              // [Hkv, G·C, D]
        at::Tensor kg = by_group(a.k.slice(0, c.k0, c.k1), Hkv, ct);              // [Hkv, S, D]
        at::Tensor vg = by_group(a.v.slice(0, c.k0, c.k1), Hkv, ct);              // [Hkv, S, Dv]
        at::Tensor gog = by_group(b.grad_out.slice(0, c.q0, c.q1), Hkv, ct);      // [Hkv, G·C, Dv]
        at::Tensor s = scores(a, qg, kg, hidden(a, seg, c), Hkv, scale);
        at::Tensor l = row_lse(a, s, Hkv, C, ct);
        at::Tensor p = at::exp(s - l);
        at::Tensor o = at::matmul(p, vg);
        at::Tensor rowdot = (gog * o).sum(-1, /*keepdim=*/true);                   // [Hkv, G·C, 1]
        at::Tensor ds = p * (at::matmul(gog, vg.transpose(1, 2)) - rowdot);
        if (dsinks.defined())
          dsinks.sub_((at::exp(sink_rows(a.sinks, Hkv, C, ct) - l) * rowdot).reshape({Hq, C}).sum(1).to(st));
        dq.slice(0, c.q0, c.q1).copy_(from_group(at::matmul(ds, kg) * scale, Hq, C));
        // [Hkv, S, D] per KV head (the sum over its G query heads is inside the matmul's reduction).
        dk.slice(0, c.k0, c.k1).add_((at::matmul(ds.transpose(1, 2), qg) * scale).permute({1, 0, 2}));
        dv.slice(0, c.k0, c.k1).add_(at::matmul(p.transpose(1, 2), gog).permute({1, 0, 2}));
      }
    }
    AttentionGrads g;
    g.dq = ref::emit(dq, dt, b.grads_out.dq);
    g.dk = ref::emit(dk, dt, b.grads_out.dk);
    g.dv = ref::emit(dv, dt, b.grads_out.dv);
    if (dsinks.defined()) g.dsinks = ref::emit(dsinks, at::kFloat, b.grads_out.dsinks);
    return g;
  }
};

}  // namespace

std::shared_ptr<Attention> make_reference_attention() { return std::make_shared<ReferenceAttention>(); }

}  // namespace ax::ops
