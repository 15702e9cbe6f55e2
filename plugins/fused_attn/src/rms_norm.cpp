// The rms_norm backend (kernels/rms_norm.cu): row views, the vector/scalar decision, the block shape,
// outputs, and the deterministic dweight (per-block partials, then launch_reduce_partials).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "backends.hpp"
#include "views.hpp"

namespace ax::fused_attn {
namespace {

constexpr const char* kOp = "rms_norm";

at::Tensor empty_like_contiguous(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
}

int elem(const ops::RmsNormArgs& a) { return static_cast<int>(a.x.element_size()); }

RmsNormArgs common(const ops::RmsNormArgs& a) {
  RmsNormArgs k;
  k.dtype = kernel_dtype(a.x.scalar_type(), kOp);
  k.H = a.x.size(-1);
  if (k.H > plan::kMaxHidden)
    throw UsageError(str(kOp, "[fused_attn]: x: hidden size ", k.H, " is past the kernels' ", plan::kMaxHidden));
  k.rows = k.H == 0 ? 0 : a.x.numel() / k.H;
  k.w = View1{a.weight.data_ptr(), a.weight.stride(0)};
  k.weight_offset = a.weight_offset;
  k.eps = static_cast<float>(a.eps);
  return k;
}

void shape(RmsNormArgs& k, const ops::RmsNormArgs& a) {
  const int vec = k.vec ? plan::vector_width(elem(a)) : 1;
  const plan::RowShape s = plan::rms_norm_shape(k.H, vec, plan::rms_norm_chunk_cap(vec));
  k.threads = s.threads;
  k.chunks = s.chunks;
}

}  // namespace

ops::RmsNormResult rms_norm_forward(const ops::RmsNormArgs& a) {
  require_cuda(a.x, kOp, "x");
  const c10::cuda::CUDAGuard guard(a.x.device());
  RmsNormArgs k = common(a);
  at::Tensor keep_x, keep_r;
  k.x = view2_or_copy(a.x, keep_x);
  const at::Tensor& xt = keep_x.defined() ? keep_x : a.x;
  ops::RmsNormResult res;
  res.y = empty_like_contiguous(a.x);
  res.rstd = at::empty({k.rows}, a.x.options().dtype(at::kFloat));
  k.y = *view2(res.y);
  k.rstd = res.rstd.data_ptr<float>();
  if (a.residual.defined()) {
    k.residual = view2_or_copy(a.residual, keep_r);
    res.sum = empty_like_contiguous(a.x);
    k.sum = *view2(res.sum);
    k.vec = plan::vectorisable(k.H, elem(a),
                               {operand(k.x, xt), operand(k.residual, keep_r.defined() ? keep_r : a.residual),
                                operand(k.sum, res.sum), operand(k.y, res.y), operand(k.w)});
  } else {
    k.vec = plan::vectorisable(k.H, elem(a), {operand(k.x, xt), operand(k.y, res.y), operand(k.w)});
  }
  shape(k, a);
  launch_rms_norm_forward(k, stream_of(a.x));
  check_launch(kOp, "forward");
  return res;
}

ops::RmsNormGrads rms_norm_backward(const ops::RmsNormArgs& a, const ops::RmsNormBackwardArgs& b) {
  require_cuda(a.x, kOp, "x");
  const c10::cuda::CUDAGuard guard(a.x.device());
  RmsNormArgs k = common(a);
  at::Tensor keep_s, keep_g, keep_gs;
  k.sum = view2_or_copy(b.sum, keep_s);
  k.gy = view2_or_copy(b.grad_y, keep_g);
  const at::Tensor rstd = b.rstd.contiguous();
  k.rstd = const_cast<float*>(rstd.data_ptr<float>());
  ops::RmsNormGrads g;
  g.dx = empty_like_contiguous(a.x);
  k.dx = *view2(g.dx);
  const plan::Operand s_op = operand(k.sum, keep_s.defined() ? keep_s : b.sum);
  const plan::Operand g_op = operand(k.gy, keep_g.defined() ? keep_g : b.grad_y);
  if (b.grad_sum.defined()) {
    k.grad_sum = view2_or_copy(b.grad_sum, keep_gs);
    k.vec = plan::vectorisable(
        k.H, elem(a),
        {s_op, g_op, operand(k.grad_sum, keep_gs.defined() ? keep_gs : b.grad_sum), operand(k.dx, g.dx), operand(k.w)});
  } else {
    k.vec = plan::vectorisable(k.H, elem(a), {s_op, g_op, operand(k.dx, g.dx), operand(k.w)});
  }
  shape(k, a);
  const cudaStream_t stream = stream_of(a.x);
  at::Tensor partial;
  if (b.need_dweight && k.rows > 0) {
    k.blocks = plan::reduction_blocks(k.rows, 1, sm_count(a.x), std::max(1, 2048 / k.threads));
    partial = at::empty({k.blocks, k.H}, a.x.options().dtype(at::kFloat));
    k.partial = partial.data_ptr<float>();
  } else {
    k.blocks = static_cast<int>(plan::row_blocks(k.rows, 1));
  }
  launch_rms_norm_backward(k, stream);
  check_launch(kOp, "backward");
  if (b.need_dweight) {
    g.dweight = at::empty({k.H}, a.weight.options());
    if (k.rows == 0) {
      g.dweight.zero_();  // a sum over no rows
    } else {
      launch_reduce_partials(k.partial, k.blocks, k.H, k.dtype, View1{g.dweight.data_ptr(), 1}, stream);
      check_launch(kOp, "dweight reduction");
    }
  }
  return g;
}

namespace {

class FusedRmsNorm final : public ops::RmsNorm {
 protected:
  ops::RmsNormResult run_forward(const ops::RmsNormArgs& a) override { return rms_norm_forward(a); }
  ops::RmsNormGrads run_backward(const ops::RmsNormArgs& a, const ops::RmsNormBackwardArgs& b) override {
    return rms_norm_backward(a, b);
  }
};

}  // namespace

std::shared_ptr<ops::RmsNorm> make_rms_norm() { return std::make_shared<FusedRmsNorm>(); }

}  // namespace ax::fused_attn
