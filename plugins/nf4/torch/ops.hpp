// The PyTorch operators torch.ops.axengine.nf4_dequantize / nf4_linear / nf4_linear_backward (registered in
// library.cpp; their use from Python: docs/plugins/nf4-python.md). Every operator takes the nf4 weight as
// bitsandbytes' QuantState spells it, one argument per field, so a bnb user passes them 1:1:
//
//   codes            Params4bit.data: uint8, two 4-bit codes per byte (bnb stores [numel/2, 1])
//   absmax           quant_state.absmax: fp32 [nblocks], or uint8 [nblocks] when double-quantised
//   shape            quant_state.shape: the logical weight shape ([N, K] for a linear layer)
//   blocksize        quant_state.blocksize
//   nested_absmax    quant_state.state2.absmax (double quant only)
//   nested_code      quant_state.state2.code   (double quant only; fp32 [256])
//   offset           quant_state.offset        (double quant only)
//   nested_blocksize quant_state.state2.blocksize
//
// The kernels per dispatch key live in kernels.cpp (CPU, CUDA), meta.cpp (Meta: shapes only, SymInt-aware,
// what fake tensors and torch.compile run) and autograd.cpp (Autograd: nf4_linear's backward through the
// nf4_linear_backward operator, so a traced backward is made of registered operators too).
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/SymIntArrayRef.h>

#include "axengine/ops/quant_formats.hpp"

namespace ax::nf4::torch_ops {

using OptTensor = std::optional<at::Tensor>;

// The engine's weight struct from the operator arguments (no copies; validated by its consumers).
ops::WeightTensor weight_of(const at::Tensor& codes, const at::Tensor& absmax, c10::IntArrayRef shape,
                            int64_t blocksize, const OptTensor& nested_absmax, const OptTensor& nested_code,
                            double offset, int64_t nested_blocksize);

// Argument checks (checks.cpp), run by every kernel: TORCH_CHECK failures naming the operator's arguments.
void check_weight(const at::Tensor& codes, const at::Tensor& absmax, c10::SymIntArrayRef shape, int64_t blocksize,
                  const OptTensor& nested_absmax, const OptTensor& nested_code, int64_t nested_blocksize);
// x [*, K] against the [N, K] weight; bias, lora_a, lora_b (optional) in x's dtype.
void check_linear(const at::Tensor& x, c10::SymIntArrayRef shape, const OptTensor& bias, const OptTensor& lora_a,
                  const OptTensor& lora_b);
void check_out_dtype(at::ScalarType dtype);  // nf4_dequantize's dtype

// nf4_dequantize: the whole weight, shape `shape`, dtype `dtype`, on codes' device.
at::Tensor dequantize_kernel(const at::Tensor& codes, const at::Tensor& absmax, c10::IntArrayRef shape,
                             int64_t blocksize, at::ScalarType dtype, const OptTensor& nested_absmax,
                             const OptTensor& nested_code, double offset, int64_t nested_blocksize);
at::Tensor dequantize_meta(const at::Tensor& codes, const at::Tensor& absmax, c10::SymIntArrayRef shape,
                           int64_t blocksize, at::ScalarType dtype, const OptTensor& nested_absmax,
                           const OptTensor& nested_code, double offset, int64_t nested_blocksize);

// nf4_linear: y = x·deq(W)ᵀ + bias + scaling·(x·Aᵀ)·Bᵀ (linear.lora, docs/ops/linear.lora.md).
at::Tensor linear_kernel(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& absmax,
                         c10::IntArrayRef shape, int64_t blocksize, const OptTensor& nested_absmax,
                         const OptTensor& nested_code, double offset, int64_t nested_blocksize,
                         const OptTensor& bias, const OptTensor& lora_a, const OptTensor& lora_b, double scaling);
at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& absmax,
                       c10::SymIntArrayRef shape, int64_t blocksize, const OptTensor& nested_absmax,
                       const OptTensor& nested_code, double offset, int64_t nested_blocksize,
                       const OptTensor& bias, const OptTensor& lora_a, const OptTensor& lora_b, double scaling);
at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& absmax,
                           c10::SymIntArrayRef shape, int64_t blocksize, const OptTensor& nested_absmax,
                           const OptTensor& nested_code, double offset, int64_t nested_blocksize,
                           const OptTensor& bias, const OptTensor& lora_a, const OptTensor& lora_b,
                           double scaling);

// nf4_linear_backward: (grad_x, grad_lora_a, grad_lora_b). output_mask = {dx wanted, dA and dB wanted}; an
// output not wanted (or dA/dB without LoRA) is an empty [0] tensor of x's dtype, so the schema's three
// outputs are always tensors.
using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
Grads linear_backward_kernel(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& codes,
                             const at::Tensor& absmax, c10::IntArrayRef shape, int64_t blocksize,
                             const OptTensor& nested_absmax, const OptTensor& nested_code, double offset,
                             int64_t nested_blocksize, const OptTensor& lora_a, const OptTensor& lora_b,
                             double scaling, std::array<bool, 2> output_mask);
Grads linear_backward_meta(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& codes,
                           const at::Tensor& absmax, c10::SymIntArrayRef shape, int64_t blocksize,
                           const OptTensor& nested_absmax, const OptTensor& nested_code, double offset,
                           int64_t nested_blocksize, const OptTensor& lora_a, const OptTensor& lora_b,
                           double scaling, std::array<bool, 2> output_mask);

}  // namespace ax::nf4::torch_ops
