// The swiglu backend (kernels/swiglu.cu). Both input forms become two [rows, I] views (gate_up: its two
// halves, the up view starting I columns in), so one kernel serves both; outputs are contiguous.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include "backends.hpp"
#include "views.hpp"

namespace ax::fused_attn {
namespace {

constexpr const char* kOp = "swiglu";

struct Inputs {
  SwigluArgs k;
  int elem = 0;
  std::vector<int64_t> out_sizes;
  at::Tensor keep_a, keep_b;
  plan::Operand gate_op, up_op;
};

Inputs inputs(const ops::SwigluArgs& a) {
  Inputs in;
  if (a.gate_up.defined()) {
    const at::Tensor& gu = a.gate_up;
    in.k.dtype = kernel_dtype(gu.scalar_type(), kOp);
    in.elem = static_cast<int>(gu.element_size());
    in.k.I = gu.size(-1) / 2;
    in.k.rows = gu.size(-1) == 0 ? 0 : gu.numel() / gu.size(-1);
    in.k.gate = view2_or_copy(gu, in.keep_a);
    in.k.up = in.k.gate;
    in.k.up.p = advance(in.k.gate.p, in.k.I * in.k.gate.si, in.elem);
    const at::Tensor& t = in.keep_a.defined() ? in.keep_a : gu;
    in.gate_op = operand(in.k.gate, t);
    in.up_op = operand(in.k.up, t);
    in.out_sizes = gu.sizes().vec();
    in.out_sizes.back() = in.k.I;
  } else {
    in.k.dtype = kernel_dtype(a.gate.scalar_type(), kOp);
    in.elem = static_cast<int>(a.gate.element_size());
    in.k.I = a.gate.size(-1);
    in.k.rows = in.k.I == 0 ? 0 : a.gate.numel() / in.k.I;
    in.k.gate = view2_or_copy(a.gate, in.keep_a);
    in.k.up = view2_or_copy(a.up, in.keep_b);
    in.gate_op = operand(in.k.gate, in.keep_a.defined() ? in.keep_a : a.gate);
    in.up_op = operand(in.k.up, in.keep_b.defined() ? in.keep_b : a.up);
    in.out_sizes = a.gate.sizes().vec();
  }
  return in;
}

}  // namespace

at::Tensor swiglu_forward(const ops::SwigluArgs& a) {
  const at::Tensor& any = a.gate_up.defined() ? a.gate_up : a.gate;
  require_cuda(any, kOp, a.gate_up.defined() ? "gate_up" : "gate");
  const c10::cuda::CUDAGuard guard(any.device());
  Inputs in = inputs(a);
  at::Tensor y = at::empty(in.out_sizes, any.options());
  in.k.y = *view2(y);
  in.k.vec = plan::vectorisable(in.k.I, in.elem, {in.gate_op, in.up_op, operand(in.k.y, y)});
  launch_swiglu_forward(in.k, stream_of(any));
  check_launch(kOp, "forward");
  return y;
}

ops::SwigluGrads swiglu_backward(const ops::SwigluArgs& a, const ops::SwigluBackwardArgs& b) {
  const at::Tensor& any = a.gate_up.defined() ? a.gate_up : a.gate;
  require_cuda(any, kOp, a.gate_up.defined() ? "gate_up" : "gate");
  const c10::cuda::CUDAGuard guard(any.device());
  Inputs in = inputs(a);
  at::Tensor keep_g;
  in.k.gy = view2_or_copy(b.grad_y, keep_g);
  const plan::Operand gy_op = operand(in.k.gy, keep_g.defined() ? keep_g : b.grad_y);
  ops::SwigluGrads g;
  plan::Operand dg_op, du_op;
  if (a.gate_up.defined()) {
    g.dgate_up = at::empty(a.gate_up.sizes(), any.options());
    in.k.dgate = *view2(g.dgate_up);
    in.k.dup = in.k.dgate;
    in.k.dup.p = advance(in.k.dgate.p, in.k.I, in.elem);
    dg_op = operand(in.k.dgate, g.dgate_up);
    du_op = operand(in.k.dup, g.dgate_up);
  } else {
    g.dgate = at::empty(a.gate.sizes(), any.options());
    g.dup = at::empty(a.gate.sizes(), any.options());
    in.k.dgate = *view2(g.dgate);
    in.k.dup = *view2(g.dup);
    dg_op = operand(in.k.dgate, g.dgate);
    du_op = operand(in.k.dup, g.dup);
  }
  in.k.vec = plan::vectorisable(in.k.I, in.elem, {in.gate_op, in.up_op, gy_op, dg_op, du_op});
  launch_swiglu_backward(in.k, stream_of(any));
  check_launch(kOp, "backward");
  return g;
}

namespace {

class FusedSwiglu final : public ops::Swiglu {
 protected:
  at::Tensor run_forward(const ops::SwigluArgs& a) override { return swiglu_forward(a); }
  ops::SwigluGrads run_backward(const ops::SwigluArgs& a, const ops::SwigluBackwardArgs& b) override {
    return swiglu_backward(a, b);
  }
};

}  // namespace

std::shared_ptr<ops::Swiglu> make_swiglu() { return std::make_shared<FusedSwiglu>(); }

}  // namespace ax::fused_attn
