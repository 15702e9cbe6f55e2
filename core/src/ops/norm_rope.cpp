// validate() for norm_rope.
#include "axengine/ops/norm_rope.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

namespace {
constexpr const char* kOp = "norm_rope";

std::vector<int64_t> with_last(at::IntArrayRef lead, int64_t last) {
  auto v = lead.vec();
  v.push_back(last);
  return v;
}
}  // namespace

void validate(const NormRopeArgs& a) {
  check::defined(kOp, "x", a.x);
  if (a.x.dim() < 2) check::fail(kOp, "x", str("must be [..., heads, head_dim], got ", check::shape_str(a.x.sizes())));
  check::compute_dtype(kOp, "x", a.x);
  const auto dt = a.x.scalar_type();
  const at::Device dev = a.x.device();
  const int64_t D = a.x.size(-1);
  const auto lead = a.x.sizes().slice(0, a.x.dim() - 2);
  check::shape(kOp, "weight", a.weight, {D});
  check::dtype(kOp, "weight", a.weight, dt);
  check::same_device(kOp, "weight", a.weight, "x", dev);
  if (!(a.eps >= 0)) check::fail(kOp, "eps", str("must be >= 0, got ", a.eps));

  const bool given = a.cos.defined() || a.sin.defined();
  const bool computed = a.position_ids.defined() || a.inv_freq.defined();
  if (given && computed)
    check::fail(kOp, "cos", "give either cos/sin or position_ids/inv_freq, not both");
  if (!given && !computed) check::fail(kOp, "cos", "the rotation needs cos/sin or position_ids/inv_freq");
  int64_t R;
  if (given) {
    check::defined(kOp, "cos", a.cos);
    check::defined(kOp, "sin", a.sin);
    R = a.cos.size(-1);
    if (R < 2 || R % 2 != 0 || R > D)
      check::fail(kOp, "cos", str("last dim (the rotary dim) must be even and in 2..head_dim ", D, ", got ", R));
    check::shape(kOp, "cos", a.cos, with_last(lead, R));
    check::shape(kOp, "sin", a.sin, with_last(lead, R));
    check::compute_dtype(kOp, "cos", a.cos);
    check::dtype(kOp, "sin", a.sin, a.cos.scalar_type());
    check::same_device(kOp, "cos", a.cos, "x", dev);
    check::same_device(kOp, "sin", a.sin, "x", dev);
  } else {
    check::defined(kOp, "position_ids", a.position_ids);
    check::defined(kOp, "inv_freq", a.inv_freq);
    check::rank(kOp, "inv_freq", a.inv_freq, 1);
    check::dtype(kOp, "inv_freq", a.inv_freq, at::kFloat);
    R = 2 * a.inv_freq.size(0);
    if (R < 2 || R > D)
      check::fail(kOp, "inv_freq", str("must have 1..head_dim/2 = ", D / 2, " entries, got ", a.inv_freq.size(0)));
    check::shape(kOp, "position_ids", a.position_ids, lead.vec());
    check::dtype(kOp, "position_ids", a.position_ids, at::kLong);
    check::same_device(kOp, "position_ids", a.position_ids, "x", dev);
    check::same_device(kOp, "inv_freq", a.inv_freq, "x", dev);
  }
  check::out_like(kOp, "out", a.out, a.x.sizes(), dt, dev);
}

void validate_backward(const NormRopeArgs& a, const NormRopeBackwardArgs& b) {
  check::defined(kOp, "grad_y", b.grad_y);
  check::out_like(kOp, "grad_y", b.grad_y, a.x.sizes(), a.x.scalar_type(), a.x.device());
  check::out_like(kOp, "out.dx", b.out.dx, a.x.sizes(), a.x.scalar_type(), a.x.device());
  check::out_like(kOp, "out.dweight", b.out.dweight, a.weight.sizes(), a.weight.scalar_type(), a.x.device());
}

}  // namespace ax::ops
