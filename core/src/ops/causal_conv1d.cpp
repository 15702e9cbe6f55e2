// validate() for causal_conv1d.
#include "axengine/ops/causal_conv1d.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kConvOp = "causal_conv1d";

std::vector<int64_t> state_shape(const CausalConv1dArgs& a) {
  return {a.cu_seqlens.size(0) - 1, a.weight.size(1) - 1, a.x.size(1)};
}
}  // namespace

void validate(const CausalConv1dArgs& a) {
  check::rank(kConvOp, "x", a.x, 2);
  check::compute_dtype(kConvOp, "x", a.x);
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  const int64_t T = a.x.size(0), C = a.x.size(1);
  check::rank(kConvOp, "weight", a.weight, 2);
  check::shape(kConvOp, "weight", a.weight, {C, -1});
  if (a.weight.size(1) < 1) check::fail(kConvOp, "weight", "the kernel width (dim 1) must be >= 1");
  check::dtype(kConvOp, "weight", a.weight, dt);
  check::same_device(kConvOp, "weight", a.weight, "x", dev);
  check::cu_seqlens(kConvOp, "cu_seqlens", a.cu_seqlens, T, dev, "x", a.check_values);
  if (a.initial_state.defined()) {
    check::shape(kConvOp, "initial_state", a.initial_state, state_shape(a));
    check::dtype(kConvOp, "initial_state", a.initial_state, dt);
    check::same_device(kConvOp, "initial_state", a.initial_state, "x", dev);
  }
  check::out_like(kConvOp, "out", a.out, a.x.sizes(), dt, dev);
}

void validate_backward(const CausalConv1dArgs& a, const CausalConv1dBackwardArgs& b) {
  check::defined(kConvOp, "grad_y", b.grad_y);
  check::out_like(kConvOp, "grad_y", b.grad_y, a.x.sizes(), a.x.scalar_type(), a.x.device());
  if (b.grad_final_state.defined()) {
    if (!a.output_final_state)
      check::fail(kConvOp, "grad_final_state", "is given but the forward returned no final state (output_final_state)");
    check::out_like(kConvOp, "grad_final_state", b.grad_final_state, state_shape(a), a.x.scalar_type(), a.x.device());
  }
}

}  // namespace ax::ops
