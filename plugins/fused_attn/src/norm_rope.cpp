// The norm_rope backend (kernels/norm_rope.cu): argument views, the vector/scalar decision, outputs
// (written in place into a caller's `out` whose lead dims collapse, else through a copy), and the
// deterministic dweight (per-block partials, then launch_reduce_partials).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "backends.hpp"
#include "views.hpp"

namespace ax::fused_attn {
namespace {

constexpr const char* kOp = "norm_rope";
// Partial-sum blocks per SM of the backward: the kernel holds ~64 registers per thread, so 4 blocks of
// 256 threads are resident per SM; more would only add partial rows.
constexpr int kBackwardBlocksPerSm = 4;

// The output view: the caller's tensor when its lead dims collapse, else a contiguous buffer that
// finish() copies into it.
struct Output {
  at::Tensor result, buffer;
  View3 view;
};

Output output3(const at::Tensor& given, const at::Tensor& like) {
  Output o;
  if (given.defined()) {
    if (auto v = view3(given)) {
      o.result = given;
      o.view = *v;
      return o;
    }
  }
  o.buffer = at::empty(like.sizes(), like.options().memory_format(at::MemoryFormat::Contiguous));
  o.view = *view3(o.buffer);
  o.result = given.defined() ? given : o.buffer;
  return o;
}

void finish(Output& o) {
  if (o.buffer.defined() && !o.buffer.is_same(o.result)) o.result.copy_(o.buffer);
}

// The kernel arguments every call shares, with the copies (kept alive here) of inputs whose lead dims do
// not collapse.
struct Prepared {
  NormRopeArgs k;
  int elem = 0;
  at::Tensor x, keep_x, keep_cos, keep_sin, keep_pos;
};
Prepared prepare(const ops::NormRopeArgs& a);

}  // namespace

at::Tensor norm_rope_forward(const ops::NormRopeArgs& a) {
  require_cuda(a.x, kOp, "x");
  const c10::cuda::CUDAGuard guard(a.x.device());
  Prepared p = prepare(a);
  Output y = output3(a.out, a.x);
  p.k.y = y.view;
  p.k.vec = plan::vectorisable(p.k.D, p.elem, {operand(p.k.x, p.x), operand(y.view, y.result)});
  launch_norm_rope_forward(p.k, stream_of(a.x));
  check_launch(kOp, "forward");
  finish(y);
  return y.result;
}

ops::NormRopeGrads norm_rope_backward(const ops::NormRopeArgs& a, const ops::NormRopeBackwardArgs& b) {
  ops::NormRopeGrads g;
  if (!b.need_dx && !b.need_dweight) return g;
  require_cuda(a.x, kOp, "x");
  const c10::cuda::CUDAGuard guard(a.x.device());
  Prepared p = prepare(a);
  at::Tensor keep_g;
  p.k.gy = view3_or_copy(b.grad_y, keep_g);
  const at::Tensor& gy_t = keep_g.defined() ? keep_g : b.grad_y;
  Output dx;
  if (b.need_dx) {
    dx = output3(b.out.dx, a.x);
    p.k.dx = dx.view;
    p.k.vec =
        plan::vectorisable(p.k.D, p.elem, {operand(p.k.x, p.x), operand(p.k.gy, gy_t), operand(dx.view, dx.result)});
  } else {
    p.k.vec = plan::vectorisable(p.k.D, p.elem, {operand(p.k.x, p.x), operand(p.k.gy, gy_t)});
  }
  const plan::NormRopeShape sh = plan::norm_rope_shape(p.k.D, p.k.heads, p.k.vec ? plan::vector_width(p.elem) : 1);
  const cudaStream_t stream = stream_of(a.x);
  const bool rows = p.k.tokens > 0 && p.k.heads > 0;
  at::Tensor partial;
  // The heads-major kernels hand out (token, run of heads) items, 256 / lanes per block.
  const int lanes = plan::norm_rope_group_lanes(p.k.D, p.k.R, p.k.vec ? plan::vector_width(p.elem) : 1, p.k.vec);
  const int64_t work = lanes ? plan::norm_rope_items(p.k.tokens, p.k.heads) : p.k.tokens;
  const int64_t per_block = lanes ? plan::kNormRopeThreads / lanes : sh.tokens_per_iteration;
  if (b.need_dweight && rows) {
    // The heads-major kernel holds fewer registers: twice the partial rows keep more loads in flight.
    p.k.blocks = plan::reduction_blocks(work, per_block, sm_count(a.x), lanes ? 2 * kBackwardBlocksPerSm : kBackwardBlocksPerSm);
    partial = at::empty({p.k.blocks, p.k.D}, a.x.options().dtype(at::kFloat));
    p.k.partial = partial.data_ptr<float>();
  } else {
    p.k.blocks = static_cast<int>(plan::row_blocks(work, per_block));
  }
  if (rows) {
    launch_norm_rope_backward(p.k, stream);
    check_launch(kOp, "backward");
  }
  if (b.need_dx) {
    finish(dx);
    g.dx = dx.result;
  }
  if (b.need_dweight) {
    at::Tensor dw = b.out.dweight.defined() ? b.out.dweight : at::empty({p.k.D}, a.weight.options());
    if (!rows) {
      dw.zero_();  // a sum over no rows
    } else {
      launch_reduce_partials(p.k.partial, p.k.blocks, p.k.D, p.k.dtype, View1{dw.data_ptr(), dw.stride(0)}, stream);
      check_launch(kOp, "dweight reduction");
    }
    g.dweight = dw;
  }
  return g;
}

namespace {

Prepared prepare(const ops::NormRopeArgs& a) {
  Prepared p;
  NormRopeArgs& k = p.k;
  k.dtype = kernel_dtype(a.x.scalar_type(), kOp);
  p.elem = static_cast<int>(a.x.element_size());
  const int64_t D = a.x.size(-1);
  if (D > plan::kMaxHeadDim)
    throw UsageError(str(kOp, "[fused_attn]: x: head_dim ", D, " is past the kernels' ", plan::kMaxHeadDim));
  k.D = static_cast<int>(D);
  k.heads = static_cast<int>(a.x.size(-2));
  k.tokens = 1;
  for (int64_t d = 0; d + 2 < a.x.dim(); ++d) k.tokens *= a.x.size(d);
  if (D == 0) k.tokens = 0;  // nothing to normalise (and the kernels divide by D)
  k.x = view3_or_copy(a.x, p.keep_x);
  p.x = p.keep_x.defined() ? p.keep_x : a.x;
  k.w = View1{a.weight.data_ptr(), a.weight.stride(0)};
  k.weight_offset = a.weight_offset;
  k.eps = static_cast<float>(a.eps);
  if (a.cos.defined()) {
    k.R = static_cast<int>(a.cos.size(-1));
    k.cs_dtype = kernel_dtype(a.cos.scalar_type(), kOp);
    k.cos = view2_or_copy(a.cos, p.keep_cos);
    k.sin = view2_or_copy(a.sin, p.keep_sin);
  } else {
    k.R = static_cast<int>(2 * a.inv_freq.size(0));
    k.pos = view1_or_copy(a.position_ids, p.keep_pos);
    k.inv_freq = View1{a.inv_freq.data_ptr(), a.inv_freq.stride(0)};
    k.scaling = static_cast<float>(a.attention_scaling);
  }
  return p;
}

class FusedNormRope final : public ops::NormRope {
 protected:
  at::Tensor run_forward(const ops::NormRopeArgs& a) override { return norm_rope_forward(a); }
  ops::NormRopeGrads run_backward(const ops::NormRopeArgs& a, const ops::NormRopeBackwardArgs& b) override {
    return norm_rope_backward(a, b);
  }
};

}  // namespace

std::shared_ptr<ops::NormRope> make_norm_rope() { return std::make_shared<FusedNormRope>(); }

}  // namespace ax::fused_attn
