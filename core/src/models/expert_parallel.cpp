// Expert parallelism (docs/distributed.md): which experts this rank holds, its LoRA shard, the gathered
// adapter for checkpoints, and the dispatch / combine all-to-alls around the local moe.mlp call.
#include "models/expert_parallel.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/decoder.hpp"

namespace ax::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AllToAllState : torch::CustomClassHolder {
  ExpertComm* comm = nullptr;
  std::vector<int64_t> send, recv;  // rows to each rank / from each rank, in forward
};

std::vector<int64_t> host_vector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Rows of `in` to the ranks (send[d] to rank d), theirs back (recv[d] from rank d).
at::Tensor all_to_all_rows(ExpertComm& comm, const at::Tensor& in, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv) {
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = sum_of(recv);
  at::Tensor out = at::empty(shape, in.options());
  comm.all_to_all(out, in.contiguous(), recv, send);
  return out;
}

// The all-to-all as an autograd node: its gradient is the same exchange with the splits swapped (each row's
// gradient goes back to the rank the row came from).
struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& in, c10::intrusive_ptr<AllToAllState> st) {
    at::Tensor out = all_to_all_rows(*st->comm, in.detach(), st->send, st->recv);
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<AllToAllState>(ctx->saved_data["state"].toCapsule());
    return {all_to_all_rows(*st->comm, grads[0], st->recv, st->send), at::Tensor()};
  }
};

at::Tensor exchange(ExpertComm& comm, const at::Tensor& in, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  auto st = c10::make_intrusive<AllToAllState>();
  st->comm = &comm;
  st->send = send;
  st->recv = recv;
  return AllToAllFn::apply(in, st);
}

}  // namespace

at::Tensor expert_parallel_mlp(ExpertComm& comm, const std::shared_ptr<ops::MoeMlp>& op, ops::MoeMlpArgs a,
                               int64_t num_experts) {
  const int64_t D = comm.size(), E_local = num_experts / D, T = a.x.size(0), H = a.x.size(1), k = a.routing.top_k;
  const auto long_opts = a.routing.sorted_expert_idxs.options().dtype(at::kLong);
  // Each token's expert ids [T, k], back from the sorted routing (-1 stays -1: it goes nowhere).
  at::Tensor top_i = at::empty({T * k}, long_opts)
                         .scatter_(0, a.routing.sorted_scattered_idxs.to(at::kLong), a.routing.sorted_expert_idxs.to(at::kLong))
                         .view({T, k});
  at::Tensor dest = at::where(top_i >= 0, at::floor_divide(top_i, E_local), at::full_like(top_i, -1));  // owning rank
  // (rank, token) pairs where the token has an expert on that rank, ordered by rank then token: the send order.
  at::Tensor hit = (dest.unsqueeze(0) == at::arange(D, long_opts).view({D, 1, 1})).any(-1);  // [D, T]
  at::Tensor pairs = hit.nonzero();
  at::Tensor to = pairs.select(1, 0), tok = pairs.select(1, 1);
  at::Tensor send_counts = hit.sum(1).to(at::kLong);  // [D]
  // Local expert ids as the receiver sees them: -1 for the token's slots owned by another rank.
  at::Tensor sel = top_i.index_select(0, tok);
  at::Tensor ids = at::where(dest.index_select(0, tok) == to.unsqueeze(1), sel - to.unsqueeze(1) * E_local, at::full_like(sel, -1));

  // Counts first (one int64 per pair of ranks), so that every rank sizes what it receives.
  const std::vector<int64_t> ones(static_cast<std::size_t>(D), 1);
  const std::vector<int64_t> send = host_vector(send_counts);
  const std::vector<int64_t> recv = host_vector(all_to_all_rows(comm, send_counts, ones, ones));
  at::Tensor ids_in = all_to_all_rows(comm, ids, send, recv);  // [R, k]
  // Rows and gates travel together (one collective, one autograd node): gates are x's dtype by moe.mlp's contract.
  at::Tensor payload = at::cat({a.x.index_select(0, tok), a.gates.index_select(0, tok).to(a.x.scalar_type())}, 1);
  at::Tensor in = exchange(comm, payload, send, recv);  // [R, H + k]
  const int64_t R = in.size(0);

  at::Tensor y_local;
  if (R == 0) {
    y_local = in.narrow(1, 0, H) * 0;  // no rows here; kept on the graph so that backward's exchange runs on every rank
  } else {
    // moe.experts' routing over the local experts: active entries sorted by expert, the -1 slots after the
    // last offset (a valid layout: they contribute nothing).
    at::Tensor flat = ids_in.reshape({-1});
    at::Tensor key = at::where(flat >= 0, flat, at::full_like(flat, E_local));
    auto [sorted, perm] = key.sort(/*stable=*/true, 0, false);
    ops::MoeMlpArgs b = std::move(a);
    b.routing.sorted_expert_idxs = at::where(sorted == E_local, at::full_like(sorted, -1), sorted);
    b.routing.sorted_scattered_idxs = perm;
    b.routing.expert_offsets = at::zeros({E_local}, long_opts)
                                   .scatter_add_(0, at::clamp_max(key, E_local - 1), (key < E_local).to(at::kLong))
                                   .cumsum(0);
    b.routing.top_k = k;
    b.x = in.narrow(1, 0, H);
    b.gates = in.narrow(1, H, k);
    b.out = at::Tensor();
    b.check_values = false;
    y_local = autograd::moe_mlp(op, std::move(b));  // [R, H]: each received token's gated sum over its local experts
  }
  at::Tensor back = exchange(comm, y_local, recv, send);  // [S, H], in send order
  return at::zeros({T, H}, back.options()).index_add(0, tok, back);
}

void DecoderModel::init_expert_parallel() {
  ep_local_ = cfg_.num_experts;
  if (!ep_) return;
  const int64_t N = ep_->size();
  if (cfg_.num_experts <= 0)
    throw UsageError(str("[distributed] expert_parallel = ", N, ": ", cfg_.source, " (", cfg_.model_type, ") has no experts"));
  if (cfg_.num_experts % N != 0)
    throw UsageError(str("[distributed] expert_parallel = ", N, " does not divide the ", cfg_.num_experts, " experts of ",
                         cfg_.source));
  ep_local_ = cfg_.num_experts / N;
  ep_first_ = ep_->rank() * ep_local_;
}

LoraSet DecoderModel::shard_expert_lora(LoraSet full) const {
  if (!ep_) return full;
  for (auto& m : full.modules) {
    if (!m.site.experts) continue;
    const int64_t r = m.r;
    m.a = m.a.detach().narrow(0, ep_first_ * r, ep_local_ * r).clone().requires_grad_(true);
    m.b = m.b.detach().narrow(1, ep_first_ * r, ep_local_ * r).clone().requires_grad_(true);
    m.site.num_experts = ep_local_;
  }
  return full;
}

void DecoderModel::gather_expert_lora() {
  if (!ep_) return;
  LoraSet out = lora_;
  for (auto& m : out.modules) {
    if (!m.site.experts) continue;
    // a [r·E_local, K] stacks by rank along dim 0; b [N, r·E_local] along dim 1 (gathered transposed):
    // rank order is expert order.
    m.a = ep_->all_gather(m.a.detach());
    m.b = ep_->all_gather(m.b.detach().t().contiguous()).t().contiguous();
    m.site.num_experts = cfg_.num_experts;
  }
  ep_gathered_ = std::move(out);
}

}  // namespace ax::models
