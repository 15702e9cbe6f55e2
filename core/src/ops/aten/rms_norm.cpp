// The `aten` rms_norm: the contract's rounding points (docs/ops/rms_norm.md) in a handful of ATen kernels,
// computing in the compute dtype where the contract rounds and in fp32 only for the statistics:
//   s = x + residual (one kernel, rounded on store), rstd from an fp32 copy of s, n = round(s · rstd) written
//   straight into the compute dtype (mul_out casts on store), y = n · w' in the compute dtype.
// Backward: fp32 throughout, one rounding of dx and dweight; dweight is an ATen reduction over rows (a fixed
// order, no atomics).
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/rms_norm.hpp"

namespace ax::ops {
namespace {

class AtenRmsNorm final : public RmsNorm {
 protected:
  RmsNormResult run_forward(const RmsNormArgs& a) override {
    const auto dt = a.x.scalar_type();
    const int64_t H = a.x.size(-1), rows = a.x.numel() / H;
    at::Tensor s = a.residual.defined() ? at::add(a.x, a.residual) : a.x;
    at::Tensor s2 = s.reshape({rows, H});
    at::Tensor sf = s2.to(at::kFloat);
    at::Tensor rstd = at::mean(at::square(sf), {1}, /*keepdim=*/true);
    rstd.add_(a.eps).rsqrt_();
    at::Tensor n = at::empty({rows, H}, a.x.options());
    at::mul_out(n, sf, rstd);  // fp32 product, rounded once on store
    at::Tensor y;
    if (a.weight_offset) {
      y = at::empty_like(n);
      at::mul_out(y, n, a.weight.to(at::kFloat) + 1.0);  // (1 + w) in fp32, as the reference
    } else {
      y = n.mul_(a.weight);  // in place: n is ours
    }
    RmsNormResult r;
    r.y = y.view(a.x.sizes());
    if (a.residual.defined()) r.sum = s;
    r.rstd = rstd.view({rows});
    return r;
  }

  RmsNormGrads run_backward(const RmsNormArgs& a, const RmsNormBackwardArgs& b) override {
    const auto dt = a.x.scalar_type();
    const int64_t H = a.x.size(-1), rows = a.x.numel() / H;
    at::Tensor rstd = b.rstd.reshape({rows, 1});
    at::Tensor nh = at::mul(b.sum.reshape({rows, H}), rstd);  // fp32 (s in dt times fp32 rstd)
    at::Tensor g = b.grad_y.reshape({rows, H}).to(at::kFloat);
    RmsNormGrads out;
    // Σ_rows g · n with n the rounded value the forward scaled; fp32 products and sum.
    if (b.need_dweight) out.dweight = at::mul(g, nh.to(dt)).sum(0).to(a.weight.scalar_type());
    at::Tensor wv = a.weight_offset ? a.weight.to(at::kFloat) + 1.0 : a.weight.to(at::kFloat);
    at::Tensor dn = at::mul(g, wv);  // fp32
    at::Tensor c = at::mean(dn * nh, {1}, /*keepdim=*/true);
    at::Tensor ds = dn.sub_(nh.mul_(c)).mul_(rstd);
    if (b.grad_sum.defined()) ds.add_(b.grad_sum.reshape({rows, H}));
    out.dx = ds.to(dt).view(a.x.sizes());
    return out;
  }
};

}  // namespace

std::shared_ptr<RmsNorm> make_aten_rms_norm() { return std::make_shared<AtenRmsNorm>(); }

}  // namespace ax::ops
