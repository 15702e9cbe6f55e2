// validate() for linear.lora.
#include "axengine/ops/linear_lora.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kOp = "linear.lora";

std::vector<int64_t> y_shape(const LinearLoraArgs& a) {
  auto s = a.x.sizes().vec();
  s.back() = a.weight.shape[0];
  return s;
}
}  // namespace

void validate(const LinearLoraArgs& a) {
  check::defined(kOp, "x", a.x);
  if (a.x.dim() < 1) check::fail(kOp, "x", "must be [..., K]");
  check::compute_dtype(kOp, "x", a.x);
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  validate_weight(a.weight, str(kOp, ": weight"));
  if (a.weight.dim() != 2) check::fail(kOp, "weight", str("must be 2-dim [N, K], got ", a.weight.describe()));
  if ((a.weight.format == WeightFormat::mxfp4 || a.weight.format == WeightFormat::nvfp4) &&
      (a.weight.axis < 0 ? a.weight.axis + 2 : a.weight.axis) != 1)
    check::fail(kOp, "weight.axis", str(to_string(a.weight.format), " blocks must run along K (dim 1), got axis ",
                                        a.weight.axis));
  if (a.weight.device() != dev)
    check::fail(kOp, "weight", str("is on ", a.weight.device().str(), " but x is on ", dev.str()));
  if (a.weight.is_dense() && a.weight.values.scalar_type() != dt)
    check::fail(kOp, "weight", str("must have x's dtype ", check::dtype_str(dt), ", got ",
                                   check::dtype_str(a.weight.values.scalar_type())));
  const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
  if (a.x.size(-1) != K)
    check::fail(kOp, "weight", str("has K = ", K, " (", a.weight.describe(), ") but x has ", a.x.size(-1), " features"));
  if (a.bias.defined()) {
    check::shape(kOp, "bias", a.bias, {N});
    check::dtype(kOp, "bias", a.bias, dt);
    check::same_device(kOp, "bias", a.bias, "x", dev);
  }
  if (a.lora_a.defined() != a.lora_b.defined())
    check::fail(kOp, a.lora_a.defined() ? "lora_b" : "lora_a", "LoRA needs both lora_a and lora_b");
  if (a.lora_a.defined()) {
    check::rank(kOp, "lora_a", a.lora_a, 2);
    const int64_t r = a.lora_a.size(0);
    if (r < 1) check::fail(kOp, "lora_a", "rank must be >= 1");
    check::shape(kOp, "lora_a", a.lora_a, {r, K});
    check::shape(kOp, "lora_b", a.lora_b, {N, r});
    check::dtype(kOp, "lora_a", a.lora_a, dt);
    check::dtype(kOp, "lora_b", a.lora_b, dt);
    check::same_device(kOp, "lora_a", a.lora_a, "x", dev);
    check::same_device(kOp, "lora_b", a.lora_b, "x", dev);
  }
  check::out_like(kOp, "out", a.out, y_shape(a), dt, dev);
}

void validate_backward(const LinearLoraArgs& a, const LinearLoraBackwardArgs& b) {
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  check::defined(kOp, "grad_y", b.grad_y);
  check::out_like(kOp, "grad_y", b.grad_y, y_shape(a), dt, dev);
  check::out_like(kOp, "out.dx", b.out.dx, a.x.sizes(), dt, dev);
  if (a.lora_a.defined()) {
    check::out_like(kOp, "out.dlora_a", b.out.dlora_a, a.lora_a.sizes(), dt, dev);
    check::out_like(kOp, "out.dlora_b", b.out.dlora_b, a.lora_b.sizes(), dt, dev);
  }
}

}  // namespace ax::ops
