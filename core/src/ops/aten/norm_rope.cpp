// Production norm_rope: the reference's math with the row statistics in fp32 but every full-size tensor
// in the compute dtype — no fp32 copy of x (on CUDA), fewer kernels.
//
//   forward:  h = at::rms_norm(x, w')          (on CUDA LibTorch's fused kernel: fp32 statistics, one pass)
//             y[:, :R/2]  = h1·cos1 − h2·sin1,  y[:, R/2:R] = h2·cos2 + h1·sin2,  y[:, R:] = h[:, R:]
//             written straight into y (the caller's `out` when given), two kernels per half
//   backward: rms = 1/sqrt(Σx²/D + eps) from a fused fp32 norm reduction ([rows, 1], no fp32 copy of x)
//             dh1 = g1·cos1 + g2·sin2,  dh2 = g2·cos2 − g1·sin1,  dh[:, R:] = g[:, R:]
//             n = x·rms;  dw = Σ_rows dh·n;  dn = dh·w';  dx = rms·(dn − n·Σ(dn·n)/D)
// with w' = w (or 1 + w, rounded to the compute dtype) and h1/h2 the two halves of the rotary dims.
// Intermediates are rounded to the compute dtype; the reductions (Σx², Σ dn·n, Σ dh·n) accumulate in fp32
// through ATen's reduction kernels, which combine partial sums in a fixed order: deterministic.
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/norm_rope.hpp"

namespace ax::ops {
namespace {

// w' in x's dtype (at::rms_norm wants the input's dtype); (1 + w) is formed in fp32 and rounded once.
at::Tensor scale_weight(const NormRopeArgs& a) {
  return a.weight_offset ? (a.weight.to(at::kFloat) + 1.0).to(a.x.scalar_type()) : a.weight;
}

// cos and sin as [*lead, 1, R] (broadcast over heads), in their given dtype or fp32 when computed.
std::pair<at::Tensor, at::Tensor> rotation(const NormRopeArgs& a) {
  if (a.cos.defined()) return {a.cos.unsqueeze(-2), a.sin.unsqueeze(-2)};
  // HF rotary: angle = position · inv_freq in fp32, emb = cat(angle, angle), times attention_scaling.
  at::Tensor angle = a.position_ids.to(at::kFloat).unsqueeze(-1) * a.inv_freq.to(at::kFloat);
  at::Tensor emb = at::cat({angle, angle}, -1).unsqueeze(-2);
  return {emb.cos().mul_(a.attention_scaling), emb.sin().mul_(a.attention_scaling)};
}

// dst[:, :R/2] = p1·c1 − p2·s1 and dst[:, R/2:R] = p2·c2 + p1·s2 (sign = +1: the forward rotation), or
// the transposed rotation (sign = −1): dst1 = p1·c1 + p2·s2, dst2 = p2·c2 − p1·s1. Computed in fp32
// per element (TensorIterator's opmath) and rounded into dst's dtype once per kernel.
void rotate_into(const at::Tensor& dst, const at::Tensor& src, const at::Tensor& cos, const at::Tensor& sin, int64_t R,
                 bool transpose) {
  const int64_t half = R / 2;
  at::Tensor p1 = src.narrow(-1, 0, half), p2 = src.narrow(-1, half, half);
  at::Tensor c1 = cos.narrow(-1, 0, half), c2 = cos.narrow(-1, half, half);
  at::Tensor s1 = sin.narrow(-1, 0, half), s2 = sin.narrow(-1, half, half);
  at::Tensor d1 = dst.narrow(-1, 0, half), d2 = dst.narrow(-1, half, half);
  at::mul_out(d1, p1, c1);
  d1.addcmul_(p2, transpose ? s2 : s1, transpose ? 1.0 : -1.0);
  at::mul_out(d2, p2, c2);
  d2.addcmul_(p1, transpose ? s1 : s2, transpose ? -1.0 : 1.0);
  if (R < src.size(-1)) dst.narrow(-1, R, src.size(-1) - R).copy_(src.narrow(-1, R, src.size(-1) - R));
}

// 1/sqrt(mean(x²) + eps) per row, fp32 [*, H, 1]: the 2-norm reduction reads x in its dtype and
// accumulates in fp32 (dtype argument), so no fp32 copy of x is made.
at::Tensor inv_rms(const NormRopeArgs& a) {
  at::Tensor norm = at::linalg_vector_norm(a.x, 2, {-1}, /*keepdim=*/true, at::kFloat);
  return norm.square_().div_(static_cast<double>(a.x.size(-1))).add_(a.eps).rsqrt_();
}

class AtenNormRope final : public NormRope {
 protected:
  at::Tensor run_forward(const NormRopeArgs& a) override {
    at::Tensor h = at::rms_norm(a.x, {a.x.size(-1)}, scale_weight(a), a.eps);
    auto [cos, sin] = rotation(a);
    at::Tensor y = a.out.defined() ? a.out : at::empty_like(a.x, at::MemoryFormat::Contiguous);
    rotate_into(y, h, cos, sin, cos.size(-1), /*transpose=*/false);
    return y;
  }

  NormRopeGrads run_backward(const NormRopeArgs& a, const NormRopeBackwardArgs& b) override {
    auto [cos, sin] = rotation(a);
    const auto opts = a.x.options().memory_format(at::MemoryFormat::Contiguous);
    at::Tensor dh = at::empty(a.x.sizes(), opts);
    rotate_into(dh, b.grad_y, cos, sin, cos.size(-1), /*transpose=*/true);
    at::Tensor rms = inv_rms(a);
    at::Tensor n = at::empty(a.x.sizes(), opts);
    at::mul_out(n, a.x, rms);
    NormRopeGrads out;
    if (b.need_dweight) {
      at::Tensor dw = at::mul(dh, n).reshape({-1, a.x.size(-1)}).sum(0, /*keepdim=*/false, at::kFloat);
      if (b.out.dweight.defined()) out.dweight = b.out.dweight.copy_(dw);
      else out.dweight = dw.to(a.weight.scalar_type());
    }
    if (b.need_dx) {
      at::Tensor dn = dh.mul_(scale_weight(a));  // dh is not needed after this
      at::Tensor c = at::mul(dn, n).sum(-1, /*keepdim=*/true, at::kFloat).div_(static_cast<double>(a.x.size(-1)));
      at::Tensor dx = b.out.dx.defined() ? b.out.dx : at::empty(a.x.sizes(), opts);
      at::addcmul_out(dx, dn, n, c, -1.0);  // dn − n·c, in fp32 per element, rounded once
      dx.mul_(rms);
      out.dx = dx;
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<NormRope> make_aten_norm_rope() { return std::make_shared<AtenNormRope>(); }

}  // namespace ax::ops
