// CPU and CUDA kernels of the axengine::nf4_* operators (ops.hpp). CPU runs core's reference: ops::dequantize,
// and for the linear the ATen math of core/src/ops/aten/linear_lora.cpp on the dequantised weight. CUDA runs
// the plugin's kernels (nf4.hpp) — the ones the engine's nf4 backends use — on the current stream, with no
// host synchronisation, so a call can be captured in a CUDA graph. Arguments are checked as the Meta kernels
// check them (checks.cpp), then by core's validators (ops::validate_weight, ops::validate) as every caller of
// core is.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>

#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant.hpp"
#include "nf4.hpp"
#include "ops.hpp"

namespace ax::nf4::torch_ops {
namespace {

// The CUDA kernels write fp32/bf16/fp16; fp64 (accepted on CPU for gradient checks) takes core's ATen
// dequantisation on either device.
bool cuda_kernel_dtype(at::ScalarType dt) { return dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf; }

// The whole weight in `dtype`, for one call only.
at::Tensor dequantized(const ops::WeightTensor& w, at::ScalarType dtype) {
  if (w.device().is_cuda() && cuda_kernel_dtype(dtype)) {
    ops::validate_weight(w, "nf4 weight");
    at::Tensor out = at::empty(w.shape, w.codes.options().dtype(dtype));
    dequantize_range(w, 0, out);
    return out;
  }
  return ops::dequantize(w, dtype);
}

// The fused QLoRA kernels take bf16/fp16 activations on CUDA; everything else runs the ATen math below.
bool fused(const at::Tensor& x) {
  return x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
}

ops::LinearLoraArgs linear_args(const at::Tensor& x, ops::WeightTensor w, const OptTensor& bias,
                                const OptTensor& lora_a, const OptTensor& lora_b, double scaling) {
  check_linear(x, c10::fromIntArrayRefSlow(w.shape), bias, lora_a, lora_b);
  ops::LinearLoraArgs a;
  a.x = x.contiguous();  // the fused kernels read rows of K; a no-op for the usual contiguous activations
  a.weight = std::move(w);
  a.bias = bias.value_or(at::Tensor());
  a.lora_a = lora_a.value_or(at::Tensor());
  a.lora_b = lora_b.value_or(at::Tensor());
  a.scaling = scaling;
  ops::validate(a);
  return a;
}

// core/src/ops/aten/linear_lora.cpp's forward: y = x·Wᵀ (+ bias in the same addmm), then y += s·(x·Aᵀ)·Bᵀ.
at::Tensor aten_forward(const ops::LinearLoraArgs& a) {
  const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
  at::Tensor x = a.x.reshape({-1, K});
  at::Tensor y;
  {
    at::Tensor w = dequantized(a.weight, a.x.scalar_type());  // dropped at the end of this block
    y = a.bias.defined() ? at::addmm(a.bias, x, w.t()) : at::mm(x, w.t());
  }
  if (a.lora_a.defined()) y.addmm_(at::mm(x, a.lora_a.t()), a.lora_b.t(), /*beta=*/1, /*alpha=*/a.scaling);
  auto shape = a.x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

// Its backward: u = G·B; dx = G·W + s·u·A; dA = s·uᵀ·x; dB = s·Gᵀ·(x·Aᵀ). B·A is never formed.
ops::LinearLoraGrads aten_backward(const ops::LinearLoraArgs& a, const ops::LinearLoraBackwardArgs& b) {
  const int64_t N = a.weight.shape[0], K = a.weight.shape[1];
  at::Tensor g = b.grad_y.reshape({-1, N});
  const bool lora = a.lora_a.defined();
  at::Tensor u = lora ? at::mm(g, a.lora_b) : at::Tensor();  // [M, r]
  ops::LinearLoraGrads out;
  if (b.need_dx) {
    at::Tensor dx;
    {
      at::Tensor w = dequantized(a.weight, a.x.scalar_type());
      dx = at::mm(g, w);
    }
    if (lora) dx.addmm_(u, a.lora_a, /*beta=*/1, /*alpha=*/a.scaling);
    out.dx = dx.view(a.x.sizes());
  }
  if (lora && b.need_dlora) {
    at::Tensor x = a.x.reshape({-1, K});
    // alpha = s inside the GEMM (beta 0 ignores the uninitialised target): one rounding, as core does.
    out.dlora_a = at::empty(a.lora_a.sizes(), a.x.options());
    at::addmm_out(out.dlora_a, out.dlora_a, u.t(), x, /*beta=*/0, /*alpha=*/a.scaling);
    out.dlora_b = at::empty(a.lora_b.sizes(), a.x.options());
    at::addmm_out(out.dlora_b, out.dlora_b, g.t(), at::mm(x, a.lora_a.t()), /*beta=*/0, /*alpha=*/a.scaling);
  }
  return out;
}

}  // namespace

ops::WeightTensor weight_of(const at::Tensor& codes, const at::Tensor& absmax, c10::IntArrayRef shape,
                            int64_t blocksize, const OptTensor& nested_absmax, const OptTensor& nested_code,
                            double offset, int64_t nested_blocksize) {
  check_weight(codes, absmax, c10::fromIntArrayRefSlow(shape), blocksize, nested_absmax, nested_code,
               nested_blocksize);
  ops::WeightTensor w;
  w.format = ops::WeightFormat::nf4;
  w.shape = shape.vec();
  w.codes = codes;
  w.scales = absmax;
  w.blocksize = blocksize;
  if (nested_absmax) {
    w.nested_scales = *nested_absmax;
    w.nested_code = *nested_code;
    w.nested_offset = offset;
    w.nested_blocksize = nested_blocksize;
  }
  return w;
}

at::Tensor dequantize_kernel(const at::Tensor& codes, const at::Tensor& absmax, c10::IntArrayRef shape,
                             int64_t blocksize, at::ScalarType dtype, const OptTensor& nested_absmax,
                             const OptTensor& nested_code, double offset, int64_t nested_blocksize) {
  const c10::DeviceGuard guard(codes.device());
  const at::AutoDispatchBelowADInplaceOrView plain;  // see linear_kernel
  check_out_dtype(dtype);
  return dequantized(weight_of(codes, absmax, shape, blocksize, nested_absmax, nested_code, offset, nested_blocksize),
                     dtype);
}

at::Tensor linear_kernel(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& absmax,
                         c10::IntArrayRef shape, int64_t blocksize, const OptTensor& nested_absmax,
                         const OptTensor& nested_code, double offset, int64_t nested_blocksize,
                         const OptTensor& bias, const OptTensor& lora_a, const OptTensor& lora_b, double scaling) {
  const c10::DeviceGuard guard(x.device());
  // The ATen calls below compute values, never a graph: nf4_linear_backward has no Autograd kernel, and a
  // direct call with tensors that require grad would otherwise reach out= variants under autograd.
  const at::AutoDispatchBelowADInplaceOrView plain;
  const ops::LinearLoraArgs a = linear_args(
      x, weight_of(codes, absmax, shape, blocksize, nested_absmax, nested_code, offset, nested_blocksize), bias,
      lora_a, lora_b, scaling);
  return fused(x) ? linear_forward(a) : aten_forward(a);
}

Grads linear_backward_kernel(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& codes,
                             const at::Tensor& absmax, c10::IntArrayRef shape, int64_t blocksize,
                             const OptTensor& nested_absmax, const OptTensor& nested_code, double offset,
                             int64_t nested_blocksize, const OptTensor& lora_a, const OptTensor& lora_b,
                             double scaling, std::array<bool, 2> output_mask) {
  const c10::DeviceGuard guard(x.device());
  const at::AutoDispatchBelowADInplaceOrView plain;  // see linear_kernel
  const ops::LinearLoraArgs a = linear_args(
      x, weight_of(codes, absmax, shape, blocksize, nested_absmax, nested_code, offset, nested_blocksize),
      std::nullopt, lora_a, lora_b, scaling);
  ops::LinearLoraBackwardArgs b;
  b.grad_y = grad_y.contiguous();  // e.g. the stride-0 expand that sum()'s backward hands over
  b.need_dx = output_mask[0];
  b.need_dlora = output_mask[1] && a.lora_a.defined();
  ops::validate_backward(a, b);
  ops::LinearLoraGrads g;
  if (b.need_dx || b.need_dlora) g = fused(x) ? linear_backward(a, b) : aten_backward(a, b);
  // The schema returns three tensors: what was not asked for is an empty [0] (the Meta kernel agrees).
  auto or_empty = [&](const at::Tensor& t) { return t.defined() ? t : at::empty({0}, x.options()); };
  return {or_empty(g.dx), or_empty(g.dlora_a), or_empty(g.dlora_b)};
}

}  // namespace ax::nf4::torch_ops
