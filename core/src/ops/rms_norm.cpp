// validate() for rms_norm.
#include "axengine/ops/rms_norm.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kOp = "rms_norm";

// rstd is fp32; fp64 inputs (the gradient-check mode validate admits) keep fp64 statistics.
at::ScalarType stat_type(at::ScalarType x) { return x == at::kDouble ? at::kDouble : at::kFloat; }
}  // namespace

void validate(const RmsNormArgs& a) {
  check::defined(kOp, "x", a.x);
  if (a.x.dim() < 1 || a.x.size(-1) < 1)
    check::fail(kOp, "x", str("must be [..., hidden] with hidden >= 1, got ", check::shape_str(a.x.sizes())));
  check::compute_dtype(kOp, "x", a.x);
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  if (a.residual.defined()) {
    check::out_like(kOp, "residual", a.residual, a.x.sizes(), dt, dev);
  }
  check::shape(kOp, "weight", a.weight, {a.x.size(-1)});
  check::dtype(kOp, "weight", a.weight, dt);
  check::same_device(kOp, "weight", a.weight, "x", dev);
  if (!(a.eps >= 0)) check::fail(kOp, "eps", str("must be >= 0, got ", a.eps));
}

void validate_backward(const RmsNormArgs& a, const RmsNormBackwardArgs& b) {
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  check::defined(kOp, "grad_y", b.grad_y);
  check::out_like(kOp, "grad_y", b.grad_y, a.x.sizes(), dt, dev);
  check::out_like(kOp, "grad_sum", b.grad_sum, a.x.sizes(), dt, dev);
  check::defined(kOp, "sum", b.sum);
  check::out_like(kOp, "sum", b.sum, a.x.sizes(), dt, dev);
  const int64_t rows = a.x.numel() / a.x.size(-1);
  check::shape(kOp, "rstd", b.rstd, {rows});
  check::dtype(kOp, "rstd", b.rstd, stat_type(dt));
  check::same_device(kOp, "rstd", b.rstd, "x", dev);
}

}  // namespace ax::ops
