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
// Separate key boundaries (cu_seqlens_k): each query row is aligned with a key row (bottom-right, the contract)
// and the masks compare key rows with that one; query chunks then see the key rows of their sequences, read
// from both cu tensors on the host (a sync: this is the oracle's form, not the engine's hot path).
// Backward takes P = exp(S − lse) and rowsum(dO ∘ O) from the lse and out it is handed (ring attention hands
// merged ones); a row that sees no key has lse −inf and P = 0.
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

// Queries per chunk: keep the fp32 score block near 2^25 elements (128 MiB) but never below 64 rows.
template <class KeysOf>
int64_t queries_per_chunk(int64_t T, int64_t Hq, KeysOf&& keys_of) {
  const int64_t budget = int64_t{1} << 25;
  int64_t c = 64;
  while (c < T && Hq * (2 * c) * std::max<int64_t>(keys_of(2 * c), 1) <= budget) c *= 2;
  return c;
}

std::vector<Chunk> chunks(const AttentionArgs& a, int64_t T, int64_t L) {
  const int64_t back = std::max<int64_t>(L - 1, 0);
  const int64_t ahead = a.causal && !a.groups.defined() ? 0 : back;  // a group's later rows are visible
  const int64_t c = queries_per_chunk(T, a.q.size(1), [&](int64_t n) { return n + back + ahead; });
  std::vector<Chunk> out;
  for (int64_t q0 = 0; q0 < T; q0 += c) {
    const int64_t q1 = std::min(T, q0 + c);
    out.push_back({q0, q1, std::max<int64_t>(0, q0 - back), std::min(T, q1 + ahead)});
  }
  return out;
}

// With cu_seqlens_k: each chunk's keys are those of the sequences its queries lie in.
std::vector<Chunk> chunks_by_keys(const AttentionArgs& a, int64_t T) {
  const at::Tensor cq = a.cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor ck = a.cu_seqlens_k.to(at::kCPU, at::kLong).contiguous();
  const int64_t *q = cq.data_ptr<int64_t>(), *k = ck.data_ptr<int64_t>(), n = cq.numel();
  // The sequence row r lies in: the last b with cu[b] <= r (empty sequences before it are passed over).
  auto seq_of = [&](int64_t r) { return int64_t(std::upper_bound(q, q + n, r) - q) - 1; };
  const int64_t c = queries_per_chunk(T, a.q.size(1), [&](int64_t) { return a.k.size(0); });
  std::vector<Chunk> out;
  for (int64_t q0 = 0; q0 < T; q0 += c) {
    const int64_t q1 = std::min(T, q0 + c);
    out.push_back({q0, q1, k[seq_of(q0)], k[seq_of(q1 - 1) + 1]});
  }
  return out;
}

std::vector<Chunk> chunks_of(const AttentionArgs& a, int64_t T) {
  return a.cu_seqlens_k.defined() ? chunks_by_keys(a, T) : chunks(a, T, longest(a));
}

// Per query row its sequence and the key row it is aligned with; per key row its sequence (int64, on the device).
struct RowAlignment {
  at::Tensor qseg, qpos, kseg;
};

RowAlignment alignment_of(const AttentionArgs& a, int64_t T) {
  const at::Tensor cu = a.cu_seqlens.to(at::kLong);
  RowAlignment r;
  r.qpos = at::arange(T, cu.options());
  r.qseg = at::searchsorted(cu, r.qpos, /*out_int32=*/false, /*right=*/true) - 1;
  if (!a.cu_seqlens_k.defined()) {
    r.kseg = r.qseg;
    return r;
  }
  const at::Tensor cuk = a.cu_seqlens_k.to(at::kLong);
  r.kseg = at::searchsorted(cuk, at::arange(a.k.size(0), cu.options()), false, true) - 1;
  // Query i of sequence b is aligned with key row i + cu_k[b+1] − cu[b+1] (the sequences' ends meet).
  r.qpos = r.qpos + cuk.index_select(0, r.qseg + 1) - cu.index_select(0, r.qseg + 1);
  return r;
}

// True where key j (absolute row k0 + col) is hidden from query i (row q0 + row): [C, S].
at::Tensor hidden(const AttentionArgs& a, const RowAlignment& rows, const Chunk& c) {
  at::Tensor qi = rows.qpos.slice(0, c.q0, c.q1).unsqueeze(1);
  at::Tensor kj = at::arange(c.k0, c.k1, rows.qpos.options()).unsqueeze(0);
  at::Tensor m = rows.qseg.slice(0, c.q0, c.q1).unsqueeze(1) != rows.kseg.slice(0, c.k0, c.k1).unsqueeze(0);
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

// lse with −inf (a row that sees no key) as 0, so that exp(S − lse) is 0 there rather than NaN.
at::Tensor finite(const at::Tensor& lse) { return lse.masked_fill(lse.isneginf(), 0.0); }

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
    const RowAlignment rows = alignment_of(a, T);
    for (const Chunk& c : chunks_of(a, T)) {
      const int64_t C = c.q1 - c.q0;
      at::Tensor s = scores(a, by_group(a.q.slice(0, c.q0, c.q1), Hkv, ct), by_group(a.k.slice(0, c.k0, c.k1), Hkv, ct),
                            hidden(a, rows, c), Hkv, scale);
      at::Tensor l = row_lse(a, s, Hkv, C, ct);                                     // [Hkv, G·C, 1]
      at::Tensor o = at::matmul(at::exp(s - finite(l)), by_group(a.v.slice(0, c.k0, c.k1), Hkv, ct));
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
      const RowAlignment rows = alignment_of(a, T);
      for (const Chunk& c : chunks_of(a, T)) {
        const int64_t C = c.q1 - c.q0;
        at::Tensor qg = by_group(a.q.slice(0, c.q0, c.q1), Hkv, ct);              // [Hkv, G·C, D]
        at::Tensor kg = by_group(a.k.slice(0, c.k0, c.k1), Hkv, ct);              // [Hkv, S, D]
        at::Tensor vg = by_group(a.v.slice(0, c.k0, c.k1), Hkv, ct);              // [Hkv, S, Dv]
        at::Tensor gog = by_group(b.grad_out.slice(0, c.q0, c.q1), Hkv, ct);      // [Hkv, G·C, Dv]
        at::Tensor s = scores(a, qg, kg, hidden(a, rows, c), Hkv, scale);
        // The lse and out handed in, at the compute precision. Where that is finer than they were handed in (fp32
        // lse under fp64; out in bf16/fp16): this call's own plus how far the handed ones are from them rounded as
        // handed, which is nothing when they are this call's forward's (the oracle's gradients stay exact) and
        // ring attention's merged ones otherwise (the formulas' P and O).
        at::Tensor own_l = row_lse(a, s, Hkv, C, ct);
        at::Tensor own_o = at::matmul(at::exp(s - finite(own_l)), vg);
        at::Tensor l = finite(b.lse.slice(1, c.q0, c.q1).reshape({Hkv, (Hq / Hkv) * C, 1}));
        if (ct != at::kFloat) l = finite(own_l) + (l - finite(own_l).to(at::kFloat)).to(ct);
        at::Tensor o = by_group(b.out.slice(0, c.q0, c.q1), Hkv, ct);
        if (ct != dt) o = own_o + (o - own_o.to(dt).to(ct));
        at::Tensor p = at::exp(s - finite(l));
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
