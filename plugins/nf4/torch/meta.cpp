// Meta kernels of the axengine::nf4_* operators: output shapes, dtypes and strides only, for fake tensors
// (torch.compile, torch.export, opcheck). Sizes are SymInts so that a dynamic batch (x's leading dims) flows
// through a traced graph without specialising; the weight's own sizes are static in practice but are not
// assumed to be. Outputs are contiguous, as the real kernels' are. The checks are those a wrong call would
// otherwise only meet at run time on the device: they fail at trace time instead (checks.cpp).
#include <ATen/ATen.h>

#include "ops.hpp"

namespace ax::nf4::torch_ops {

at::Tensor dequantize_meta(const at::Tensor& codes, const at::Tensor& absmax, c10::SymIntArrayRef shape,
                           int64_t blocksize, at::ScalarType dtype, const OptTensor& nested_absmax,
                           const OptTensor& nested_code, double /*offset*/, int64_t nested_blocksize) {
  check_weight(codes, absmax, shape, blocksize, nested_absmax, nested_code, nested_blocksize);
  check_out_dtype(dtype);
  return at::empty_symint(shape, codes.options().dtype(dtype));
}

at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& absmax,
                       c10::SymIntArrayRef shape, int64_t blocksize, const OptTensor& nested_absmax,
                       const OptTensor& nested_code, double /*offset*/, int64_t nested_blocksize,
                       const OptTensor& bias, const OptTensor& lora_a, const OptTensor& lora_b, double /*scaling*/) {
  check_weight(codes, absmax, shape, blocksize, nested_absmax, nested_code, nested_blocksize);
  check_linear(x, shape, bias, lora_a, lora_b);
  std::vector<c10::SymInt> out(x.sym_sizes().begin(), x.sym_sizes().end());
  out.back() = shape[0];
  return at::empty_symint(out, x.options());
}

Grads linear_backward_meta(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& codes,
                           const at::Tensor& absmax, c10::SymIntArrayRef shape, int64_t blocksize,
                           const OptTensor& nested_absmax, const OptTensor& nested_code, double /*offset*/,
                           int64_t nested_blocksize, const OptTensor& lora_a, const OptTensor& lora_b,
                           double /*scaling*/, std::array<bool, 2> output_mask) {
  check_weight(codes, absmax, shape, blocksize, nested_absmax, nested_code, nested_blocksize);
  check_linear(x, shape, std::nullopt, lora_a, lora_b);
  TORCH_CHECK(grad_y.scalar_type() == x.scalar_type() && grad_y.dim() == x.dim(),
              "axengine nf4_linear_backward: grad_y must be like the forward's output");
  const auto empty = [&] { return at::empty({0}, x.options()); };
  at::Tensor dx = output_mask[0] ? at::empty_symint(x.sym_sizes(), x.options()) : empty();
  const bool dlora = output_mask[1] && lora_a.has_value();
  at::Tensor da = dlora ? at::empty_symint(lora_a->sym_sizes(), x.options()) : empty();
  at::Tensor db = dlora ? at::empty_symint(lora_b->sym_sizes(), x.options()) : empty();
  return {dx, da, db};
}

}  // namespace ax::nf4::torch_ops
