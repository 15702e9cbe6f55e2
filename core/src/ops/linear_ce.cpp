// validate() for linear_ce.
#include "axengine/ops/linear_ce.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kOp = "linear_ce";

// loss and lse are fp32; fp64 inputs (the gradient-check mode validate admits) keep fp64 statistics.
at::ScalarType stat_type(at::ScalarType h) { return h == at::kDouble ? at::kDouble : at::kFloat; }
}  // namespace

void validate(const LinearCeArgs& a) {
  check::rank(kOp, "h", a.h, 2);
  check::compute_dtype(kOp, "h", a.h);
  const int64_t T = a.h.size(0), H = a.h.size(1);
  const at::Device dev = a.h.device();
  check::rank(kOp, "weight", a.weight, 2);
  if (a.weight.size(1) != H || a.weight.size(0) < 1)
    check::fail(kOp, "weight", str("must be [V, ", H, "] with V >= 1, got ", check::shape_str(a.weight.sizes())));
  check::dtype(kOp, "weight", a.weight, a.h.scalar_type());
  check::same_device(kOp, "weight", a.weight, "h", dev);
  check::shape(kOp, "targets", a.targets, {T});
  check::dtype(kOp, "targets", a.targets, at::kLong);
  check::same_device(kOp, "targets", a.targets, "h", dev);
  if (a.check_values && T > 0) {
    const int64_t V = a.weight.size(0);
    at::Tensor t = a.targets.to(at::kCPU);
    at::Tensor bad = ((t < 0).logical_or(t >= V)).logical_and(t != a.ignore_index);
    if (bad.any().item<bool>()) {
      const int64_t i = bad.nonzero()[0][0].item<int64_t>();
      check::fail(kOp, "targets", str("each must be in [0, ", V, ") or ignore_index ", a.ignore_index, ", got ",
                                      t[i].item<int64_t>(), " at ", i));
    }
  }
}

void validate_backward(const LinearCeArgs& a, const LinearCeBackwardArgs& b) {
  const int64_t T = a.h.size(0);
  const auto st = stat_type(a.h.scalar_type());
  check::shape(kOp, "grad_loss", b.grad_loss, {T});
  check::dtype(kOp, "grad_loss", b.grad_loss, st);
  check::same_device(kOp, "grad_loss", b.grad_loss, "h", a.h.device());
  check::shape(kOp, "lse", b.lse, {T});
  check::dtype(kOp, "lse", b.lse, st);
  check::same_device(kOp, "lse", b.lse, "h", a.h.device());
  // The forward's unit gradient (ops/linear_ce.hpp): a mismatch means it came from another call.
  if (!b.saved.empty()) {
    if (b.saved.size() != 1)
      check::fail(kOp, "saved", str("must hold the forward's one unit gradient, got ", b.saved.size(), " tensors"));
    check::shape(kOp, "saved", b.saved[0], {T, a.h.size(1)});
    check::dtype(kOp, "saved", b.saved[0], a.h.scalar_type());
    check::same_device(kOp, "saved", b.saved[0], "h", a.h.device());
  }
}

}  // namespace ax::ops
