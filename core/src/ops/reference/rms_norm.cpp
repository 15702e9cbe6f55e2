// Reference rms_norm: transformers' Llama/Qwen RMSNorm, with the residual add before it, in fp32 (fp64 for
// fp64 inputs) and the contract's rounding points:
//   s = round(x + residual)       the residual stream, in the compute dtype
//   n = round(s · rstd),  rstd = 1 / sqrt(mean(s²) + eps)   (fp32 statistics)
//   y = round(n · w')             w' = w, or 1 + w with weight_offset
// For fp32 this is transformers' op sequence exactly. Backward, with n̂ = s · rstd unrounded (the rounding
// is the identity for the gradient, as autograd treats `.to(dtype)`):
//   dweight = Σ_rows g · n          (n the rounded value the forward scaled)
//   dn = g · w',   ds = rstd · (dn − n̂ · mean(dn · n̂)) + grad_sum,   dx = d residual = ds
#include <memory>

#include "axengine/ops/rms_norm.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

at::Tensor scale_of(const RmsNormArgs& a, at::ScalarType ct) {
  at::Tensor w = a.weight.to(ct);
  return a.weight_offset ? w + 1.0 : w;
}

class ReferenceRmsNorm final : public RmsNorm {
 protected:
  RmsNormResult run_forward(const RmsNormArgs& a) override {
    const auto dt = a.x.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t H = a.x.size(-1);
    at::Tensor s = a.residual.defined() ? (a.x.to(ct) + a.residual.to(ct)).to(dt) : a.x;
    at::Tensor sf = s.to(ct);
    at::Tensor rstd = at::rsqrt(sf.pow(2).mean(-1, /*keepdim=*/true) + a.eps);
    at::Tensor n = (sf * rstd).to(dt).to(ct);
    RmsNormResult r;
    r.y = (n * scale_of(a, ct)).to(dt);
    if (a.residual.defined()) r.sum = s;
    r.rstd = rstd.reshape({a.x.numel() / H});
    return r;
  }

  RmsNormGrads run_backward(const RmsNormArgs& a, const RmsNormBackwardArgs& b) override {
    const auto dt = a.x.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t H = a.x.size(-1);
    at::Tensor sf = b.sum.to(ct).reshape({-1, H});
    at::Tensor rstd = b.rstd.to(ct).unsqueeze(-1);
    at::Tensor g = b.grad_y.to(ct).reshape({-1, H});
    at::Tensor nh = sf * rstd;
    RmsNormGrads out;
    if (b.need_dweight) out.dweight = (g * nh.to(dt).to(ct)).sum(0).to(a.weight.scalar_type());
    at::Tensor dn = g * scale_of(a, ct);
    at::Tensor ds = rstd * (dn - nh * (dn * nh).mean(-1, /*keepdim=*/true));
    if (b.grad_sum.defined()) ds = ds + b.grad_sum.to(ct).reshape({-1, H});
    out.dx = ds.reshape(a.x.sizes()).to(dt);
    return out;
  }
};

}  // namespace

std::shared_ptr<RmsNorm> make_reference_rms_norm() { return std::make_shared<ReferenceRmsNorm>(); }

}  // namespace ax::ops
