// validate() for swiglu.
#include "axengine/ops/swiglu.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kOp = "swiglu";

// The shape of y: gate's, or gate_up's with the last dim halved.
std::vector<int64_t> out_shape(const SwigluArgs& a) {
  if (a.gate_up.defined()) {
    auto s = a.gate_up.sizes().vec();
    s.back() /= 2;
    return s;
  }
  return a.gate.sizes().vec();
}
}  // namespace

std::pair<at::Tensor, at::Tensor> gate_and_up(const SwigluArgs& a) {
  if (!a.gate_up.defined()) return {a.gate, a.up};
  const int64_t I = a.gate_up.size(-1) / 2;
  return {a.gate_up.narrow(-1, 0, I), a.gate_up.narrow(-1, I, I)};
}

void validate(const SwigluArgs& a) {
  const bool split = a.gate.defined() || a.up.defined();
  if (split && a.gate_up.defined()) check::fail(kOp, "gate_up", "give either gate and up or gate_up, not both");
  if (!split && !a.gate_up.defined()) check::fail(kOp, "gate_up", "the op needs gate and up, or gate_up");
  if (a.gate_up.defined()) {
    const at::Tensor& gu = a.gate_up;
    if (gu.dim() < 1 || gu.size(-1) < 2 || gu.size(-1) % 2 != 0)
      check::fail(kOp, "gate_up", str("must be [..., 2*I] with an even, non-zero last dim, got ", check::shape_str(gu.sizes())));
    check::compute_dtype(kOp, "gate_up", gu);
    return;
  }
  check::defined(kOp, "gate", a.gate);
  check::defined(kOp, "up", a.up);
  if (a.gate.dim() < 1 || a.gate.size(-1) < 1)
    check::fail(kOp, "gate", str("must be [..., I] with I >= 1, got ", check::shape_str(a.gate.sizes())));
  check::compute_dtype(kOp, "gate", a.gate);
  check::out_like(kOp, "up", a.up, a.gate.sizes(), a.gate.scalar_type(), a.gate.device());
}

void validate_backward(const SwigluArgs& a, const SwigluBackwardArgs& b) {
  const at::Tensor& ref = a.gate_up.defined() ? a.gate_up : a.gate;
  check::defined(kOp, "grad_y", b.grad_y);
  check::out_like(kOp, "grad_y", b.grad_y, out_shape(a), ref.scalar_type(), ref.device());
}

}  // namespace ax::ops
