// The `aten` causal_conv1d: the contract's math (docs/ops/causal_conv1d.md) as W gathers over the packed
// rows, no loop over sequences and no host sync (graph-safe), deterministic (gathers and elementwise sums
// in a fixed order, no scatter-add).
//
// For shift j = 0..W-1, row t (position p of sequence s) reads the input at position p − j: row t − j when
// p − j >= 0, else row W-1+(p−j) of initial_state[s], else zero. The rows, the flattened initial states
// and a zero row sit in one source buffer, so each shift is one index_select; the pre-activation sums the W
// shifts in fp32 and y = silu(pre) is rounded once. Backward is the same with the maps turned around:
// dx[t] = Σ_j weight[:, W-1-j] · dpre[t + j] over rows t + j of the same sequence, plus grad_final_state at
// the rows that make up the final state; d initial_state likewise.
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/causal_conv1d.hpp"

namespace ax::ops {
namespace {

at::ScalarType wide_of(at::ScalarType dt) { return dt == at::kDouble ? at::kDouble : at::kFloat; }

// Per packed row: its sequence, its position in it, and the sequence's start and length (int64 [T]).
struct Rows {
  at::Tensor seq, pos, start, len;
};

Rows rows_of(const at::Tensor& cu_seqlens, int64_t T) {
  const auto opt = cu_seqlens.options().dtype(at::kLong);
  at::Tensor cu = cu_seqlens.to(at::kLong);
  Rows r;
  at::Tensor t = at::arange(T, opt);
  r.seq = at::searchsorted(cu, t, /*out_int32=*/false, /*right=*/true) - 1;
  r.start = cu.index_select(0, r.seq);
  r.pos = t - r.start;
  r.len = cu.index_select(0, r.seq + 1) - r.start;
  return r;
}

// [T + N·(W-1) + 1, C]: the rows, then every sequence's W-1 state rows (when given), then a zero row.
at::Tensor sources(const at::Tensor& x, const at::Tensor& state) {
  std::vector<at::Tensor> parts{x};
  if (state.defined()) parts.push_back(state.reshape({-1, x.size(1)}));
  parts.push_back(at::zeros({1, x.size(1)}, x.options()));
  return at::cat(parts);
}

// Where the input at sequence position `p` (int64, may be < 0) of sequence `seq` lives in sources():
// the row start + p, or a state row, or the zero row.
at::Tensor source_index(const at::Tensor& seq, const at::Tensor& start, const at::Tensor& p, int64_t T, int64_t N,
                        int64_t W, bool with_state) {
  const int64_t zero_row = T + (with_state ? N * (W - 1) : 0);
  at::Tensor before = with_state ? T + seq * (W - 1) + (W - 1) + p : at::full_like(p, zero_row);
  return at::where(p >= 0, start + p, before);
}

// The pre-activation in fp32 (fp64 for fp64), [T, C].
at::Tensor pre_activation(const CausalConv1dArgs& a, const Rows& r, const at::Tensor& src) {
  const auto wide = wide_of(a.x.scalar_type());
  const int64_t T = a.x.size(0), N = a.cu_seqlens.size(0) - 1, W = a.weight.size(1);
  at::Tensor w = a.weight.to(wide);
  at::Tensor pre = at::zeros({T, a.x.size(1)}, a.x.options().dtype(wide));
  for (int64_t j = 0; j < W; ++j) {
    at::Tensor idx = source_index(r.seq, r.start, r.pos - j, T, N, W, a.initial_state.defined());
    pre.addcmul_(src.index_select(0, idx).to(wide), w.select(1, W - 1 - j));
  }
  return pre;
}

class AtenCausalConv1d final : public CausalConv1d {
 protected:
  CausalConv1dResult run_forward(const CausalConv1dArgs& a) override {
    const auto dt = a.x.scalar_type();
    const int64_t T = a.x.size(0), N = a.cu_seqlens.size(0) - 1, W = a.weight.size(1);
    const Rows r = rows_of(a.cu_seqlens, T);
    const at::Tensor src = sources(a.x, a.initial_state);
    at::Tensor pre = pre_activation(a, r, src);
    CausalConv1dResult out;
    out.y = a.out.defined() ? a.out.copy_(at::silu_(pre)) : at::silu_(pre).to(dt);
    if (a.output_final_state) {
      // final_state[b, i] is the input at position len_b − (W−1) + i.
      const auto opt = a.cu_seqlens.options().dtype(at::kLong);
      at::Tensor cu = a.cu_seqlens.to(at::kLong);
      at::Tensor start = cu.slice(0, 0, N).unsqueeze(1), len = cu.slice(0, 1).unsqueeze(1) - start;
      at::Tensor seq = at::arange(N, opt).unsqueeze(1).expand({N, W - 1});
      at::Tensor p = len - (W - 1) + at::arange(W - 1, opt).unsqueeze(0);
      at::Tensor idx = source_index(seq, start.expand({N, W - 1}), p, T, N, W, a.initial_state.defined());
      out.final_state = src.index_select(0, idx.reshape({-1})).view({N, W - 1, a.x.size(1)});
    }
    return out;
  }

  CausalConv1dGrads run_backward(const CausalConv1dArgs& a, const CausalConv1dBackwardArgs& b) override {
    const auto dt = a.x.scalar_type();
    const auto wide = wide_of(dt);
    const int64_t T = a.x.size(0), N = a.cu_seqlens.size(0) - 1, W = a.weight.size(1), C = a.x.size(1);
    const auto opt = a.cu_seqlens.options().dtype(at::kLong);
    const Rows r = rows_of(a.cu_seqlens, T);
    at::Tensor pre = pre_activation(a, r, sources(a.x, a.initial_state));
    at::Tensor sig = at::sigmoid(pre);
    // dpre = dy · silu'(pre), silu'(z) = σ(z)(1 + z(1 − σ(z))); a zero row after it for the gathers.
    at::Tensor dpre = b.grad_y.to(wide) * sig * (pre * (1.0 - sig) + 1.0);
    at::Tensor dsrc = at::cat({dpre, at::zeros({1, C}, dpre.options())});
    at::Tensor w = a.weight.to(wide);
    // grad_final_state flattened, then a zero row: final-state row i of sequence s is position len_s − (W−1) + i.
    at::Tensor gfs;
    if (b.grad_final_state.defined())
      gfs = at::cat({b.grad_final_state.to(wide).reshape({-1, C}), at::zeros({1, C}, dpre.options())});
    auto final_row = [&](const at::Tensor& seq, const at::Tensor& p, const at::Tensor& len) {
      at::Tensor i = p - (len - (W - 1));
      return at::where((i >= 0) & (i < W - 1), seq * (W - 1) + i, at::full_like(i, N * (W - 1)));
    };
    // The gradient reaching the input at sequence positions p (of sequences seq, start, len), [.., C].
    auto grad_at = [&](const at::Tensor& seq, const at::Tensor& start, const at::Tensor& p, const at::Tensor& len) {
      at::Tensor acc = at::zeros({p.numel(), C}, dpre.options());
      for (int64_t j = 0; j < W; ++j) {
        at::Tensor q = p + j;  // the output position that read p through shift j
        at::Tensor idx = at::where((q >= 0) & (q < len), start + q, at::full_like(q, T)).reshape({-1});
        acc.addcmul_(dsrc.index_select(0, idx), w.select(1, W - 1 - j));
      }
      if (gfs.defined()) acc.add_(gfs.index_select(0, final_row(seq, p, len).reshape({-1})));
      return acc;
    };
    CausalConv1dGrads g;
    g.dx = grad_at(r.seq, r.start, r.pos, r.len).to(dt);
    if (a.initial_state.defined()) {
      at::Tensor cu = a.cu_seqlens.to(at::kLong);
      at::Tensor start = cu.slice(0, 0, N).unsqueeze(1).expand({N, W - 1});
      at::Tensor len = (cu.slice(0, 1) - cu.slice(0, 0, N)).unsqueeze(1).expand({N, W - 1});
      at::Tensor seq = at::arange(N, opt).unsqueeze(1).expand({N, W - 1});
      at::Tensor p = at::arange(W - 1, opt).unsqueeze(0).expand({N, W - 1}) - (W - 1);  // state row i: position i − (W−1)
      g.dinitial_state = grad_at(seq, start, p, len).view({N, W - 1, C}).to(dt);
    }
    return g;
  }
};

}  // namespace

std::shared_ptr<CausalConv1d> make_aten_causal_conv1d() { return std::make_shared<AtenCausalConv1d>(); }

}  // namespace ax::ops
