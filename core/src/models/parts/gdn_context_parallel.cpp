#include "models/parts/gdn_context_parallel.hpp"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"

namespace ax::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor long_index(const std::vector<int64_t>& v, const at::Device& dev) {
  return at::tensor(v, at::kLong).to(dev);
}

// Rows `idx` of `src` written into a fresh zero tensor of `n` rows shaped like src's rows.
at::Tensor rows_into_zeros(int64_t n, const at::Tensor& idx, const at::Tensor& src) {
  std::vector<int64_t> shape = src.sizes().vec();
  shape[0] = n;
  return at::zeros(shape, src.options()).index_copy(0, idx, src);
}

// One chunk's rows of a rank's tokens [rows·2c, ...]: its j-th chunk of every row, [rows·c, ...].
at::Tensor gdn_chunk_rows(const at::Tensor& t, int64_t rows, int64_t c, int64_t j) {
  std::vector<int64_t> shape{rows, 2, c}, flat{rows * c};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d)), flat.push_back(t.size(d));
  return t.reshape(shape).select(1, j).reshape(flat);
}

// The inverse: the two chunks' [rows·c, ...] back into the rank's tokens [rows·2c, ...].
at::Tensor gdn_join_chunks(const at::Tensor& c0, const at::Tensor& c1, int64_t rows) {
  std::vector<int64_t> shape{rows, c0.size(0) / rows}, flat{2 * c0.size(0)};
  for (int64_t d = 1; d < c0.dim(); ++d) shape.push_back(c0.size(d)), flat.push_back(c0.size(d));
  return at::stack({c0.reshape(shape), c1.reshape(shape)}, 1).reshape(flat);
}

struct GdnChainState : torch::CustomClassHolder {
  GdnContextSplit gs;
  std::shared_ptr<ops::LinearAttention> op;
  ops::LinearAttentionArgs base;  // scale, qk_l2norm; the tensors are per chunk below
  GdnContextSplit::Sequences seqs[2];
  ops::LinearAttentionArgs args[2];  // each chunk's call (this rank's chunks j = 0, 1)
  std::vector<at::Tensor> saved[2];
  std::vector<int64_t> state_shape;  // [rows, Hv, Dk, Dv]: the state handed from chunk to chunk
  at::TensorOptions state_opts;
  explicit GdnChainState(GdnContextSplit g) : gs(std::move(g)) {}
};

// The sequences that start a carried (row, chunk) entry.
std::vector<int64_t> carried_firsts(const GdnContextSplit::Sequences& sq) {
  std::vector<int64_t> out;
  for (int64_t e : sq.carried) out.push_back(sq.first[static_cast<std::size_t>(e)]);
  return out;
}

// Chunk k (0 .. 2N-1 in row order) is held by rank k (as its first) for k < N, else by 2N-1-k (as its second).
int64_t holder_of(int64_t N, int64_t k) { return k < N ? k : 2 * N - 1 - k; }
int64_t slot_of(int64_t N, int64_t k) { return k < N ? 0 : 1; }

// `mine` (on the rank `from`; zeros like it on the others) as every rank receives it.
at::Tensor hand_over(ContextComm& comm, const at::Tensor& mine, int64_t from) {
  const int64_t n = mine.size(0);
  return comm.all_gather(mine.contiguous()).narrow(0, from * n, n);
}

// The chain over the row's chunks as one autograd node, so that its collectives run in the same order on every
// rank whatever each rank's graph needs (a rank not receiving a hop still takes part in it).
struct GdnChainFn : torch::autograd::Function<GdnChainFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& g, const at::Tensor& beta, c10::intrusive_ptr<GdnChainState> st) {
    const ContextSplit& s = st->gs.split();
    const int64_t N = s.comm->size(), r = s.comm->rank(), B = s.rows, c = s.chunk();
    st->state_shape = {B, v.size(1), q.size(2), v.size(2)};
    st->state_opts = g.options();  // the op's state dtype: g's (fp32, fp64 for fp64 inputs)
    const at::Device dev = q.device();
    at::Tensor out[2], entering, leaving;  // the state entering / leaving the current chunk, [B, Hv, Dk, Dv]
    for (int64_t kc = 0; kc < 2 * N; ++kc) {
      const int64_t holder = holder_of(N, kc), j = slot_of(N, kc);
      if (holder == r) {
        const auto& sq = st->seqs[j];
        ops::LinearAttentionArgs a = st->base;
        a.q = gdn_chunk_rows(q.detach(), B, c, j);
        a.k = gdn_chunk_rows(k.detach(), B, c, j);
        a.v = gdn_chunk_rows(v.detach(), B, c, j);
        a.g = gdn_chunk_rows(g.detach(), B, c, j);
        a.beta = gdn_chunk_rows(beta.detach(), B, c, j);
        a.cu_seqlens = sq.cu.to(dev);
        a.check_values = false;
        a.output_final_state = true;
        const int64_t n = sq.cu.size(0) - 1;
        a.initial_state = at::zeros({n, st->state_shape[1], st->state_shape[2], st->state_shape[3]}, st->state_opts);
        if (!sq.carried.empty())  // the carried rows start from the state handed over
          a.initial_state.index_copy_(0, long_index(carried_firsts(sq), dev), entering.index_select(0, long_index(sq.carried, dev)));
        auto res = st->op->forward(a);
        out[j] = res.out;
        leaving = res.final_state.index_select(0, long_index(sq.last, dev));
        st->saved[j] = std::move(res.saved);
        st->args[j] = std::move(a);
      }
      if (kc + 1 == 2 * N || !any_continues(st->gs, kc + 1)) continue;
      const int64_t next = holder_of(N, kc + 1);
      if (next == holder) entering = leaving;  // chunk N-1 to N: one rank holds both
      else entering = hand_over(*s.comm, holder == r ? leaving : at::zeros(st->state_shape, st->state_opts), holder);
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return gdn_join_chunks(out[0], out[1], B);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<GdnChainState>(ctx->saved_data["state"].toCapsule());
    const ContextSplit& s = st->gs.split();
    const int64_t N = s.comm->size(), r = s.comm->rank(), B = s.rows, c = s.chunk();
    const at::Tensor& dout = grads[0];
    const at::Device dev = dout.device();
    ops::LinearAttentionGrads got[2];
    at::Tensor d_leaving, d_entering;  // the gradients of the state leaving / entering the current chunk
    for (int64_t kc = 2 * N - 1; kc >= 0; --kc) {
      const int64_t holder = holder_of(N, kc), j = slot_of(N, kc);
      if (holder == r) {
        const auto& sq = st->seqs[j];
        const ops::LinearAttentionArgs& a = st->args[j];
        ops::LinearAttentionBackwardArgs bwd;
        bwd.grad_out = gdn_chunk_rows(dout, B, c, j).contiguous();
        bwd.grad_final_state = at::zeros_like(a.initial_state);
        if (d_leaving.defined()) bwd.grad_final_state.index_copy_(0, long_index(sq.last, dev), d_leaving);
        bwd.saved = std::move(st->saved[j]);
        got[j] = st->op->backward(a, bwd);
        // Only the carried rows' entering state came from the chunk before; the others started from zero.
        d_entering = at::zeros(st->state_shape, st->state_opts);
        if (!sq.carried.empty())
          d_entering.index_copy_(0, long_index(sq.carried, dev), got[j].dinitial_state.index_select(0, long_index(carried_firsts(sq), dev)));
      }
      d_leaving = at::Tensor();
      if (kc == 0 || !any_continues(st->gs, kc)) continue;
      if (holder_of(N, kc - 1) == holder) d_leaving = d_entering;  // chunk N to N-1: one rank holds both
      else d_leaving = hand_over(*s.comm, holder == r ? d_entering : at::zeros(st->state_shape, st->state_opts), holder);
    }
    for (auto& a : st->args) a = ops::LinearAttentionArgs();  // the chunks' inputs are not needed any more
    return {gdn_join_chunks(got[0].dq, got[1].dq, B),     gdn_join_chunks(got[0].dk, got[1].dk, B),
            gdn_join_chunks(got[0].dv, got[1].dv, B),     gdn_join_chunks(got[0].dg, got[1].dg, B),
            gdn_join_chunks(got[0].dbeta, got[1].dbeta, B), at::Tensor()};
  }

  // Whether any row's chunk k continues a sample: the hop into it carries something (every rank knows it).
  static bool any_continues(const GdnContextSplit& gs, int64_t k) {
    for (int64_t b = 0; b < gs.split().rows; ++b)
      if (gs.continues(b, k)) return true;
    return false;
  }
};

}  // namespace

GdnContextSplit::GdnContextSplit(const ContextSplit& split)
    : split_(split), cu_(split.boundaries("context parallel (Gated DeltaNet)")) {}

bool GdnContextSplit::continues(int64_t b, int64_t k) const {
  // A row starts a sample whatever cu_seqlens says (the ring's masks do not cross rows either).
  return k > 0 && !std::binary_search(cu_.begin(), cu_.end(), b * split_.seq + k * split_.chunk());
}

int64_t GdnContextSplit::sample_of(int64_t p) const {
  return static_cast<int64_t>(std::upper_bound(cu_.begin(), cu_.end(), p) - cu_.begin()) - 1;
}

GdnContextSplit::Sequences GdnContextSplit::sequences(const std::vector<int64_t>& js) const {
  const int64_t c = split_.chunk(), S = split_.seq, r = split_.comm->rank();
  Sequences out;
  std::vector<int64_t> bounds;
  for (int64_t b = 0; b < split_.rows; ++b)
    for (std::size_t i = 0; i < js.size(); ++i) {
      const int64_t k = split_.chunk_of(r, js[i]);
      const int64_t p0 = b * S + k * c, base = (b * static_cast<int64_t>(js.size()) + static_cast<int64_t>(i)) * c;
      if (continues(b, k)) out.carried.push_back(static_cast<int64_t>(out.first.size()));
      out.first.push_back(static_cast<int64_t>(bounds.size()));
      bounds.push_back(base);
      // Samples starting inside the chunk (duplicates in cu_seqlens, empty samples, start nothing new here).
      for (auto it = std::upper_bound(cu_.begin(), cu_.end(), p0); it != cu_.end() && *it < p0 + c; ++it)
        if (*it != bounds.back() - base + p0) bounds.push_back(base + *it - p0);
    }
  for (std::size_t e = 0; e < out.first.size(); ++e)
    out.last.push_back((e + 1 < out.first.size() ? out.first[e + 1] : static_cast<int64_t>(bounds.size())) - 1);
  bounds.push_back(split_.rows * static_cast<int64_t>(js.size()) * c);
  out.cu = at::tensor(bounds, at::kLong).to(at::kInt);
  return out;
}

at::Tensor GdnContextSplit::conv1d(const std::shared_ptr<ops::CausalConv1d>& op, ops::CausalConv1dArgs args) const {
  const int64_t N = split_.comm->size(), r = split_.comm->rank(), B = split_.rows, c = split_.chunk();
  const int64_t W = args.weight.size(1), C = args.x.size(1), h = W - 1;
  if (h > c)
    throw UsageError(ax::str("context parallel: the Gated DeltaNet conv1d's window (", W, " tokens) reaches past the previous ",
                         "chunk of ", c, " tokens (sequence_len / (2 x context_parallel)); use fewer ranks or longer rows"));
  const at::Device dev = args.x.device();
  const Sequences sq = sequences({0, 1});
  args.cu_seqlens = sq.cu.to(dev);
  args.check_values = false;
  args.output_final_state = false;
  if (h > 0) {
    // Every chunk's last W-1 inputs, all ranks' in row order: [B, 2N, W-1, C].
    const at::Tensor tails = args.x.reshape({B, 2, c, C}).narrow(2, c - h, h).reshape({B * 2 * h, C});
    const at::Tensor all = ContextSplit{split_.comm, B, 2 * N * h}.gather(tails).view({B * 2 * N, h, C});
    // Chunk k's window reaches into chunk k-1's tail, as far as the same sample goes.
    std::vector<int64_t> from;
    std::vector<int64_t> keep;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t k = split_.chunk_of(r, j), p0 = b * split_.seq + k * c;
        from.push_back(b * 2 * N + std::max<int64_t>(k - 1, 0));
        for (int64_t i = 0; i < h; ++i) keep.push_back(continues(b, k) && sample_of(p0 - h + i) == sample_of(p0));
      }
    const at::Tensor mask = at::tensor(keep, at::kLong).to(dev).ne(0).view({B * 2, h, 1});
    const at::Tensor halo = at::where(mask, all.index_select(0, long_index(from, dev)), at::zeros({}, all.options()));
    args.initial_state = rows_into_zeros(sq.cu.size(0) - 1, long_index(sq.first, dev), halo);
  }
  return autograd::causal_conv1d(op, std::move(args)).y;
}

at::Tensor GdnContextSplit::linear_attention(const std::shared_ptr<ops::LinearAttention>& op, ops::LinearAttentionArgs args) const {
  const int64_t Tl = split_.rows * split_.block();
  if (args.q.size(0) != Tl || args.v.size(0) != Tl)
    throw RuntimeError(ax::str("context parallel (Gated DeltaNet): q ", args.q.sizes(), ", v ", args.v.sizes(), " are not ", Tl,
                           " local tokens"));
  auto st = c10::make_intrusive<GdnChainState>(*this);
  st->op = op;
  st->base.scale = args.scale;
  st->base.qk_l2norm = args.qk_l2norm;
  st->seqs[0] = sequences({0});
  st->seqs[1] = sequences({1});
  return GdnChainFn::apply(args.q, args.k, args.v, args.g, args.beta, st);
}

}  // namespace ax::models
