// validate() for attention.
#include "axengine/ops/attention.hpp"
#include "axengine/ops/decline_chain.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kOp = "attention";
}

void validate(const AttentionArgs& a) {
  check::rank(kOp, "q", a.q, 3);
  check::compute_dtype(kOp, "q", a.q);
  const auto dt = a.q.scalar_type();
  const at::Device dev = a.q.device();
  const int64_t T = a.q.size(0), Hq = a.q.size(1), D = a.q.size(2);
  check::rank(kOp, "k", a.k, 3);
  check::rank(kOp, "v", a.v, 3);
  const int64_t Hkv = a.k.size(1);
  const bool own_k = a.cu_seqlens_k.defined();  // keys with their own boundaries: any row count
  const int64_t Tk = own_k ? a.k.size(0) : T;
  check::shape(kOp, "k", a.k, {Tk, -1, D});
  check::shape(kOp, "v", a.v, {Tk, Hkv, -1});
  if (Hkv < 1 || Hq % Hkv != 0)
    check::fail(kOp, "k", str("has ", Hkv, " heads, which must divide q's ", Hq, " heads (GQA)"));
  if (D < 1) check::fail(kOp, "q", "head_dim must be >= 1");
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"k", &a.k}, {"v", &a.v}}) {
    check::dtype(kOp, name, *t, dt);
    check::same_device(kOp, name, *t, "q", dev);
  }
  check::rank(kOp, "cu_seqlens", a.cu_seqlens, 1);
  check::dtype(kOp, "cu_seqlens", a.cu_seqlens, at::kInt);
  check::same_device(kOp, "cu_seqlens", a.cu_seqlens, "q", dev);
  if (a.cu_seqlens.numel() < 2) check::fail(kOp, "cu_seqlens", "needs at least 2 entries (one sequence)");
  if (a.max_seqlen < 0) check::fail(kOp, "max_seqlen", str("must be >= 0, got ", a.max_seqlen));
  if (!(a.softmax_scale >= 0)) check::fail(kOp, "softmax_scale", str("must be >= 0 (0 = 1/sqrt(D)), got ", a.softmax_scale));
  if (a.window_left < -1) check::fail(kOp, "window_left", str("must be >= -1, got ", a.window_left));
  check::out_like(kOp, "out", a.out, {T, Hq, a.v.size(2)}, dt, dev);
  if (a.sinks.defined()) {
    check::rank(kOp, "sinks", a.sinks, 1);
    check::shape(kOp, "sinks", a.sinks, {Hq});
    check::dtype(kOp, "sinks", a.sinks, at::kFloat);
    check::same_device(kOp, "sinks", a.sinks, "q", dev);
  }
  if (a.groups.defined()) {
    check::rank(kOp, "groups", a.groups, 1);
    check::shape(kOp, "groups", a.groups, {T});
    check::dtype(kOp, "groups", a.groups, at::kInt);
    check::same_device(kOp, "groups", a.groups, "q", dev);
    if (!a.causal) check::fail(kOp, "groups", "bidirectional groups need causal = true (without it every row sees its sequence)");
  }
  if (own_k) {
    check::cu_seqlens(kOp, "cu_seqlens_k", a.cu_seqlens_k, Tk, dev, "q", a.check_values);
    if (a.cu_seqlens_k.numel() != a.cu_seqlens.numel())
      check::fail(kOp, "cu_seqlens_k", str("has ", a.cu_seqlens_k.numel(), " entries, cu_seqlens ", a.cu_seqlens.numel(),
                                           ": one boundary per sequence on both sides"));
    if (a.groups.defined()) check::fail(kOp, "cu_seqlens_k", "is not taken with bidirectional groups");
  } else if (a.max_seqlen_k != 0) {
    check::fail(kOp, "max_seqlen_k", "is given without cu_seqlens_k");
  }
  if (a.max_seqlen_k < 0) check::fail(kOp, "max_seqlen_k", str("must be >= 0, got ", a.max_seqlen_k));
  if (a.check_values && own_k && a.max_seqlen_k > 0) {
    at::Tensor cu = a.cu_seqlens_k.to(at::kCPU, at::kLong);
    const int64_t longest = (cu.narrow(0, 1, cu.numel() - 1) - cu.narrow(0, 0, cu.numel() - 1)).max().item<int64_t>();
    if (longest > a.max_seqlen_k)
      check::fail(kOp, "max_seqlen_k", str("is ", a.max_seqlen_k, " but the longest key sequence has ", longest, " rows"));
  }
  if (a.check_values) {
    at::Tensor cu = a.cu_seqlens.to(at::kCPU).contiguous();
    const int32_t* c = cu.data_ptr<int32_t>();
    const int64_t n = cu.numel();
    if (c[0] != 0) check::fail(kOp, "cu_seqlens", str("must start at 0, got ", c[0]));
    int64_t longest = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (c[i] < c[i - 1])
        check::fail(kOp, "cu_seqlens", str("must be nondecreasing, got ", c[i - 1], " then ", c[i], " at ", i));
      longest = std::max<int64_t>(longest, c[i] - c[i - 1]);
    }
    if (c[n - 1] != T) check::fail(kOp, "cu_seqlens", str("must end at the token count ", T, ", got ", c[n - 1]));
    if (a.max_seqlen > 0 && longest > a.max_seqlen)
      check::fail(kOp, "max_seqlen", str("is ", a.max_seqlen, " but the longest sequence has ", longest, " tokens"));
  }
}

void validate_backward(const AttentionArgs& a, const AttentionBackwardArgs& b) {
  const auto dt = a.q.scalar_type();
  const at::Device dev = a.q.device();
  const std::vector<int64_t> o = {a.q.size(0), a.q.size(1), a.v.size(2)};
  check::defined(kOp, "grad_out", b.grad_out);
  check::out_like(kOp, "grad_out", b.grad_out, o, dt, dev);
  check::defined(kOp, "out", b.out);
  check::out_like(kOp, "out", b.out, o, dt, dev);
  check::defined(kOp, "lse", b.lse);
  check::out_like(kOp, "lse", b.lse, {a.q.size(1), a.q.size(0)}, at::kFloat, dev);
  check::out_like(kOp, "grads_out.dq", b.grads_out.dq, a.q.sizes(), dt, dev);
  check::out_like(kOp, "grads_out.dk", b.grads_out.dk, a.k.sizes(), dt, dev);
  check::out_like(kOp, "grads_out.dv", b.grads_out.dv, a.v.sizes(), dt, dev);
  if (b.grads_out.dsinks.defined() && !a.sinks.defined())
    check::fail(kOp, "grads_out.dsinks", "is given but the call has no sinks");
  check::out_like(kOp, "grads_out.dsinks", b.grads_out.dsinks, {a.q.size(1)}, at::kFloat, dev);
}

std::shared_ptr<Attention> attention_chain(std::vector<NamedAttention> backends) {
  return std::make_shared<DeclineChain<Attention, NamedAttention, AttentionArgs, AttentionResult, AttentionBackwardArgs,
                                       AttentionGrads>>(std::move(backends));
}

}  // namespace ax::ops
