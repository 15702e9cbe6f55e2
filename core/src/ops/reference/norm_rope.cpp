// Reference norm_rope in fp32: RMSNorm over head_dim, scale by w (or 1 + w), rotate the first R dims.
// Backward, with n = x·rms and h = n·w':
//   dh = [g_rot·cos − rotate_half(g_rot·sin), g_pass]     (rotate_half's transpose is −rotate_half)
//   dw = Σ_rows dh·n,   dn = dh·w',   dx = rms·(dn − n·mean(dn·n))
#include <memory>

#include "axengine/ops/norm_rope.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

at::Tensor rotate_half(const at::Tensor& u) {
  const int64_t h = u.size(-1) / 2;
  return at::cat({-u.slice(-1, h), u.slice(-1, 0, h)}, -1);
}

struct Parts {
  at::Tensor rms, n, wv, cos, sin;  // rms [*, H, 1]; cos/sin [*, 1, R]
  int64_t R;
};

Parts prepare(const NormRopeArgs& a, at::ScalarType ct) {
  Parts p;
  at::Tensor x = a.x.to(ct);
  p.rms = at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + a.eps);
  p.n = x * p.rms;
  p.wv = a.weight_offset ? a.weight.to(ct) + 1.0 : a.weight.to(ct);
  if (a.cos.defined()) {
    p.cos = a.cos.to(ct);
    p.sin = a.sin.to(ct);
  } else {
    // HF rotary: freqs = position · inv_freq (fp32), emb = cat(freqs, freqs), cos/sin · attention_scaling
    at::Tensor freqs = a.position_ids.to(ct).unsqueeze(-1) * a.inv_freq.to(ct);
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    p.cos = emb.cos() * a.attention_scaling;
    p.sin = emb.sin() * a.attention_scaling;
  }
  p.R = p.cos.size(-1);
  p.cos = p.cos.unsqueeze(-2);  // broadcast over heads
  p.sin = p.sin.unsqueeze(-2);
  return p;
}

class ReferenceNormRope final : public NormRope {
 protected:
  at::Tensor run_forward(const NormRopeArgs& a) override {
    const auto ct = ref::compute_type(a.x.scalar_type());
    Parts p = prepare(a, ct);
    at::Tensor h = p.n * p.wv;
    at::Tensor rot = h.slice(-1, 0, p.R);
    at::Tensor y = at::cat({rot * p.cos + rotate_half(rot) * p.sin, h.slice(-1, p.R)}, -1);
    return ref::emit(y, a.x.scalar_type(), a.out);
  }

  NormRopeGrads run_backward(const NormRopeArgs& a, const NormRopeBackwardArgs& b) override {
    const auto ct = ref::compute_type(a.x.scalar_type());
    Parts p = prepare(a, ct);
    at::Tensor g = b.grad_y.to(ct);
    at::Tensor grot = g.slice(-1, 0, p.R);
    at::Tensor dh = at::cat({grot * p.cos - rotate_half(grot * p.sin), g.slice(-1, p.R)}, -1);
    NormRopeGrads out;
    if (b.need_dweight)
      out.dweight = ref::emit((dh * p.n).reshape({-1, a.x.size(-1)}).sum(0), a.weight.scalar_type(), b.out.dweight);
    if (b.need_dx) {
      at::Tensor dn = dh * p.wv;
      at::Tensor dx = p.rms * (dn - p.n * (dn * p.n).mean(-1, /*keepdim=*/true));
      out.dx = ref::emit(dx, a.x.scalar_type(), b.out.dx);
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<NormRope> make_reference_norm_rope() { return std::make_shared<ReferenceNormRope>(); }

}  // namespace ax::ops
