// The linear_ce backend: chunks of Tc tokens (plan::linear_ce_chunk_rows, [kernels.options.fused_attn]
// linear_ce_chunk_mib) so that only one chunk's logits [Tc, V] ever exist.
//   forward:  logits_c = h_c · Wᵀ (cuBLAS through at::mm: compute-dtype output, fp32 accumulation), then
//             one row kernel: lse and loss (kernels/linear_ce.cu); with grad_in_forward the same kernel
//             then turns the chunk in place into g = softmax − onehot, and dh_unit_c = g · W goes straight
//             into the saved [T, H] buffer: two GEMMs per chunk for forward and backward together
//   backward: with the forward's saved dh_unit, one elementwise kernel dh = round(grad_loss · dh_unit);
//             without it, logits_c again, the row kernel turns them in place into g, then dh_c = g · W
// Both GEMMs write into buffers allocated once per call; every step is deterministic. No host sync:
// the targets' range is validate()'s business (check_values); an unchecked bad target gives a NaN loss.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include "backends.hpp"
#include "views.hpp"

namespace ax::fused_attn {
namespace {

constexpr const char* kOp = "linear_ce";

struct Chunks {
  int64_t T = 0, V = 0, Tc = 0;
  at::Tensor buffer;  // [Tc, V] logits of one chunk, contiguous
  at::Tensor keep_targets;
};

Chunks chunks(const ops::LinearCeArgs& a, const Options& o) {
  Chunks c;
  c.T = a.h.size(0);
  c.V = a.weight.size(0);
  const int64_t bytes = o.linear_ce_chunk_mib << 20;
  c.Tc = plan::linear_ce_chunk_rows(c.T, c.V, static_cast<int>(a.h.element_size()), bytes);
  c.buffer = at::empty({c.Tc, c.V}, a.h.options().memory_format(at::MemoryFormat::Contiguous));
  return c;
}

CeArgs row_args(const ops::LinearCeArgs& a, Chunks& c) {
  CeArgs k;
  k.dtype = kernel_dtype(a.h.scalar_type(), kOp);
  k.V = c.V;
  k.logits = View2{c.buffer.data_ptr(), c.V, 1};
  k.targets = view1_or_copy(a.targets, c.keep_targets);
  k.ignore_index = a.ignore_index;
  // Chunks start at row multiples of the buffer's: every chunk is as aligned as the buffer.
  k.vec = plan::vectorisable(c.V, static_cast<int>(a.h.element_size()), {operand(k.logits, c.buffer)});
  return k;
}

}  // namespace

ops::LinearCeResult linear_ce_forward(const ops::LinearCeArgs& a, const Options& o) {
  require_cuda(a.h, kOp, "h");
  const c10::cuda::CUDAGuard guard(a.h.device());
  Chunks c = chunks(a, o);
  ops::LinearCeResult res;
  res.loss = at::empty({c.T}, a.h.options().dtype(at::kFloat));
  res.lse = at::empty({c.T}, a.h.options().dtype(at::kFloat));
  CeArgs k = row_args(a, c);
  k.lse = res.lse.data_ptr<float>();
  k.loss = res.loss.data_ptr<float>();
  at::Tensor dh_unit;
  if (a.grad_in_forward) {
    dh_unit = at::empty({c.T, a.h.size(1)}, a.h.options().memory_format(at::MemoryFormat::Contiguous));
    res.saved = {dh_unit};
    k.unit_grad = true;
  }
  const at::Tensor wt = a.weight.t();
  for (int64_t t0 = 0; t0 < c.T; t0 += c.Tc) {
    const int64_t tc = std::min(c.Tc, c.T - t0);
    at::Tensor logits = c.buffer.narrow(0, 0, tc);
    at::mm_out(logits, a.h.narrow(0, t0, tc), wt);
    k.t0 = t0;
    k.rows = tc;
    launch_ce_forward(k, stream_of(a.h));
    check_launch(kOp, "forward row kernel");
    if (dh_unit.defined()) {
      at::Tensor dh_c = dh_unit.narrow(0, t0, tc);
      at::mm_out(dh_c, logits, a.weight);
    }
  }
  return res;
}

namespace {

// dh = round(grad_loss · dh_unit) from the forward's saved unit gradient: no GEMM, W untouched.
at::Tensor scale_saved(const ops::LinearCeArgs& a, const ops::LinearCeBackwardArgs& b) {
  const at::Tensor& unit = b.saved[0];
  at::Tensor dh = at::empty(unit.sizes(), unit.options().memory_format(at::MemoryFormat::Contiguous));
  CeScaleArgs k;
  k.dtype = kernel_dtype(unit.scalar_type(), kOp);
  k.rows = unit.size(0);
  k.H = unit.size(1);
  at::Tensor keep_u, keep_t, keep_g;
  k.unit = view2_or_copy(unit, keep_u);
  k.dh = View2{dh.data_ptr(), k.H, 1};
  k.targets = view1_or_copy(a.targets, keep_t);
  k.ignore_index = a.ignore_index;
  k.grad_loss = view1_or_copy(b.grad_loss, keep_g);
  k.vec = plan::vectorisable(k.H, static_cast<int>(unit.element_size()),
                             {operand(k.unit, keep_u.defined() ? keep_u : unit), operand(k.dh, dh)});
  launch_ce_scale(k, stream_of(a.h));
  check_launch(kOp, "backward scale kernel");
  return dh;
}

}  // namespace

at::Tensor linear_ce_backward(const ops::LinearCeArgs& a, const ops::LinearCeBackwardArgs& b, const Options& o) {
  require_cuda(a.h, kOp, "h");
  const c10::cuda::CUDAGuard guard(a.h.device());
  if (!b.saved.empty()) return scale_saved(a, b);
  Chunks c = chunks(a, o);
  at::Tensor dh = at::empty({c.T, a.h.size(1)}, a.h.options().memory_format(at::MemoryFormat::Contiguous));
  CeArgs k = row_args(a, c);
  at::Tensor keep_l, keep_g;
  k.lse_in = view1_or_copy(b.lse, keep_l);
  k.grad_loss = view1_or_copy(b.grad_loss, keep_g);
  const at::Tensor wt = a.weight.t();
  for (int64_t t0 = 0; t0 < c.T; t0 += c.Tc) {
    const int64_t tc = std::min(c.Tc, c.T - t0);
    at::Tensor logits = c.buffer.narrow(0, 0, tc);
    at::mm_out(logits, a.h.narrow(0, t0, tc), wt);
    k.t0 = t0;
    k.rows = tc;
    launch_ce_backward(k, stream_of(a.h));
    check_launch(kOp, "backward row kernel");
    at::Tensor dh_c = dh.narrow(0, t0, tc);
    at::mm_out(dh_c, logits, a.weight);
  }
  return dh;
}

namespace {

class FusedLinearCe final : public ops::LinearCe {
 public:
  explicit FusedLinearCe(std::shared_ptr<const Context> ctx) : ctx_(std::move(ctx)) {}

 protected:
  ops::LinearCeResult run_forward(const ops::LinearCeArgs& a) override { return linear_ce_forward(a, ctx_->options); }
  at::Tensor run_backward(const ops::LinearCeArgs& a, const ops::LinearCeBackwardArgs& b) override {
    return linear_ce_backward(a, b, ctx_->options);
  }

 private:
  std::shared_ptr<const Context> ctx_;
};

}  // namespace

std::shared_ptr<ops::LinearCe> make_linear_ce(std::shared_ptr<const Context> ctx) {
  return std::make_shared<FusedLinearCe>(std::move(ctx));
}

}  // namespace ax::fused_attn
