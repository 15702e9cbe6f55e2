// Production linear.lora: every product in the compute dtype (bf16/fp16) through ATen's GEMMs — cuBLAS on
// CUDA, which accumulates bf16/fp16 products in fp32 by default; the process-wide cuBLAS reduction flags
// (allowBF16ReductionCuBLAS, ...) are the engine's, never touched here. A packed W (nf4/mxfp4/nvfp4) is
// dequantised into the compute dtype inside the call and dropped as soon as its GEMM has run: the model
// keeps only the packed base.
//
//   forward:  y = x·Wᵀ (+ bias, in the same addmm)     then  y += s·(x·Aᵀ)·Bᵀ   (addmm_, beta 1)
//   backward: u = G·B,  t = x·Aᵀ (recomputed: [rows, r], thin)
//             dx = G·W,  dx += s·u·A   (addmm_, beta 1: one buffer, no elementwise kernel)
//             dA = s·uᵀ·x,   dB = s·Gᵀ·t   (alpha = s inside the GEMM: one rounding)
// B·A is never formed. Every GEMM has a fixed shape and order, so results are bitwise repeatable.
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant.hpp"

namespace ax::ops {
namespace {

// W [N, K] in x's dtype: the dense values as they are, a packed weight dequantised for this call only.
at::Tensor weight_of(const LinearLoraArgs& a) {
  return a.weight.is_dense() ? a.weight.values : dequantize(a.weight, a.x.scalar_type());
}

// Where a 2-D result goes: the caller's preallocated tensor when it can be written through a plain view
// (GEMMs write a contiguous result without a copy), else a fresh buffer that finish() copies over.
at::Tensor target(const at::Tensor& out, at::IntArrayRef shape2d, const at::TensorOptions& opts) {
  if (out.defined() && out.is_contiguous()) return out.view(shape2d);
  return at::empty(shape2d, opts);
}
at::Tensor finish(const at::Tensor& result2d, const at::Tensor& out, at::IntArrayRef shape) {
  if (!out.defined()) return result2d.view(shape);
  if (!result2d.is_alias_of(out)) out.copy_(result2d.view(shape));
  return out;
}

// dst = alpha·(m1·m2). beta = 0 makes addmm ignore dst's (uninitialised) contents, NaNs included, and
// alpha is applied inside the GEMM (one rounding, no separate scaling kernel).
void gemm_scaled(at::Tensor& dst, const at::Tensor& m1, const at::Tensor& m2, double alpha) {
  at::addmm_out(dst, dst, m1, m2, /*beta=*/0, /*alpha=*/alpha);
}

class AtenLinearLora final : public LinearLora {
 protected:
  at::Tensor run_forward(const LinearLoraArgs& a) override {
    const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
    at::Tensor x = a.x.reshape({-1, K});
    const int64_t M = x.size(0);
    auto shape = a.x.sizes().vec();
    shape.back() = N;
    at::Tensor y = target(a.out, {M, N}, a.x.options());
    {
      at::Tensor w = weight_of(a);  // freed at the end of this block when it was dequantised
      if (a.bias.defined()) at::addmm_out(y, a.bias, x, w.t());  // cuBLASLt fuses the bias broadcast
      else at::mm_out(y, x, w.t());
    }
    if (a.lora_a.defined()) {
      at::Tensor t = at::mm(x, a.lora_a.t());                      // [M, r]
      y.addmm_(t, a.lora_b.t(), /*beta=*/1, /*alpha=*/a.scaling);  // accumulates into y
    }
    return finish(y, a.out, shape);
  }

  LinearLoraGrads run_backward(const LinearLoraArgs& a, const LinearLoraBackwardArgs& b) override {
    const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
    at::Tensor g = b.grad_y.reshape({-1, N});
    const int64_t M = g.size(0);
    const bool lora = a.lora_a.defined();
    const auto opts = a.x.options();
    at::Tensor u = lora && (b.need_dx || b.need_dlora) ? at::mm(g, a.lora_b) : at::Tensor();  // [M, r]
    LinearLoraGrads out;
    if (b.need_dx) {
      at::Tensor dx = target(b.out.dx, {M, K}, opts);
      {
        at::Tensor w = weight_of(a);
        at::mm_out(dx, g, w);
      }
      if (lora) dx.addmm_(u, a.lora_a, /*beta=*/1, /*alpha=*/a.scaling);
      out.dx = finish(dx, b.out.dx, a.x.sizes());
    }
    if (lora && b.need_dlora) {
      at::Tensor x = a.x.reshape({-1, K});
      const int64_t r = a.lora_a.size(0);
      at::Tensor da = target(b.out.dlora_a, {r, K}, opts);
      gemm_scaled(da, u.t(), x, a.scaling);
      out.dlora_a = finish(da, b.out.dlora_a, a.lora_a.sizes());
      at::Tensor t = at::mm(x, a.lora_a.t());  // [M, r], recomputed rather than kept from forward
      at::Tensor db = target(b.out.dlora_b, {N, r}, opts);
      gemm_scaled(db, g.t(), t, a.scaling);
      out.dlora_b = finish(db, b.out.dlora_b, a.lora_b.sizes());
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<LinearLora> make_aten_linear_lora() { return std::make_shared<AtenLinearLora>(); }

}  // namespace ax::ops
