#include "models/context_parallel.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SplitState : torch::CustomClassHolder {
  ContextSplit split;
};

// [rows·seq, ...] viewed as [rows, 2·size, chunk, ...]: rank r's tokens of every row are chunks r and 2·size-1-r.
std::vector<int64_t> chunked_shape(const at::Tensor& t, int64_t rows, int64_t chunks, int64_t chunk) {
  std::vector<int64_t> shape{rows, chunks, chunk};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return shape;
}

std::vector<int64_t> flat_shape(const at::Tensor& t, int64_t n) {
  std::vector<int64_t> shape{n};
  for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
  return shape;
}

// The gather as an autograd node: forward all-gathers the local rows (each rank's [rows, 2, chunk, ...] stacked
// in rank order) and puts every chunk back at its place in its row; backward is the reduce-scatter: the whole-batch gradient
// summed over the group (every rank's attention contributed to every rank's k and v), this rank's rows kept.
struct GatherFn : torch::autograd::Function<GatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, c10::intrusive_ptr<SplitState> st) {
    const ContextSplit& s = st->split;
    const int64_t N = s.comm->size();
    at::Tensor all = s.comm->all_gather(local.detach().contiguous());  // [size·rows·block, ...]
    std::vector<int64_t> shape{N, s.rows, 2 * s.chunk()};
    for (int64_t d = 1; d < local.dim(); ++d) shape.push_back(local.size(d));
    // [rows, size·2, chunk, ...]: rank-major chunks; row chunk c is rank c's first (c < size) or rank
    // 2·size-1-c's second.
    at::Tensor by_rank = all.view(shape).transpose(0, 1).reshape(chunked_shape(local, s.rows, 2 * N, s.chunk()));
    std::vector<int64_t> order;
    for (int64_t c = 0; c < 2 * N; ++c) order.push_back(c < N ? 2 * c : 2 * (2 * N - 1 - c) + 1);
    at::Tensor full = by_rank.index_select(1, at::tensor(order, at::kLong).to(local.device()))
                          .reshape(flat_shape(local, s.rows * s.seq));
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return full;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<SplitState>(ctx->saved_data["state"].toCapsule());
    at::Tensor g = grads[0].contiguous().clone();
    st->split.comm->all_reduce_sum(g);
    return {st->split.local(g), at::Tensor()};
  }
};

// The group's sum as the value (bit for bit what the all-reduce gives), the local share's gradient unchanged.
struct LossSumFn : torch::autograd::Function<LossSumFn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& local, c10::intrusive_ptr<SplitState> st) {
    at::Tensor total = local.detach().clone();
    st->split.comm->all_reduce_sum(total);
    return total;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

}  // namespace

int64_t ContextSplit::block() const { return seq / comm->size(); }
int64_t ContextSplit::chunk() const { return seq / (2 * comm->size()); }
int64_t ContextSplit::chunk_of(int64_t r, int64_t j) const { return j == 0 ? r : 2 * comm->size() - 1 - r; }

const std::vector<int64_t>& ContextSplit::boundaries(const char* who) const {
  if (!cu) throw RuntimeError(str(who, ": the context-parallel split carries no host cu_seqlens"));
  if (cu->size() < 2 || cu->front() != 0 || cu->back() != rows * seq)
    throw RuntimeError(str(who, ": cu_seqlens must run from 0 to the batch's ", rows * seq, " tokens, got ", cu->size(),
                           " entries ending at ", cu->empty() ? 0 : cu->back()));
  return *cu;
}

std::shared_ptr<const std::vector<int64_t>> host_boundaries(const at::Tensor& cu_seqlens_host) {
  if (!cu_seqlens_host.is_cpu())
    throw RuntimeError(str("context parallel: cu_seqlens on ", cu_seqlens_host.device().str(), " given as the host copy"));
  const at::Tensor c = cu_seqlens_host.to(at::kLong).contiguous();
  return std::make_shared<const std::vector<int64_t>>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

at::Tensor ContextSplit::local(const at::Tensor& full) const {
  if (full.size(0) != rows * seq)
    throw RuntimeError(str("context parallel: a whole-batch tensor has ", full.size(0), " rows, not ", rows * seq));
  const int64_t r = comm->rank();
  at::Tensor c = full.reshape(chunked_shape(full, rows, 2 * comm->size(), chunk()));
  return at::stack({c.select(1, chunk_of(r, 0)), c.select(1, chunk_of(r, 1))}, 1).reshape(flat_shape(full, rows * block()));
}

at::Tensor ContextSplit::gather(const at::Tensor& local) const {
  if (local.size(0) != rows * block())
    throw RuntimeError(str("context parallel: a gathered tensor has ", local.size(0), " rows, not ", rows * block()));
  auto st = c10::make_intrusive<SplitState>();
  st->split = *this;
  return GatherFn::apply(local, st);
}

at::Tensor context_parallel_loss(ContextComm& comm, const at::Tensor& local) {
  auto st = c10::make_intrusive<SplitState>();
  st->split.comm = &comm;
  return LossSumFn::apply(local, st);
}

}  // namespace ax::models
