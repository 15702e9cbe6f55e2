// The nf4 plugin's CUDA entry points: host functions that launch on ATen's current CUDA stream. The plugin's
// axengine backends (dequant, quantizer, linear.lora for nf4 weights) and the PyTorch operators of the
// TORCH_LIBRARY registration (torch.ops.axengine.*) are both thin wrappers over these, so a Python user and
// the engine run the same kernels. Formats: core/include/axengine/ops/quant_formats.hpp, docs/ops/dequant.md.
#pragma once
#include <cstdint>

#include <ATen/core/Tensor.h>

#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant_formats.hpp"

namespace ax::nf4 {

// Decodes elements [start, start + out.numel()) of the flattened nf4 weight `w` (plain or double-quantised
// absmax, any blocksize bitsandbytes allows) into `out`, a contiguous CUDA tensor of fp32/bf16/fp16 on w's
// device. Bit-exact with ops::dequantize(w, out.scalar_type()) over the same elements. `start` and the count
// need not be block-aligned (a chunk of rows of an [N, K] weight is a range).
void dequantize_range(const ops::WeightTensor& w, int64_t start, const at::Tensor& out);

// The selective form of dequant: out [S, shape[1:]...] (contiguous, on w's device) = w[experts] for int64
// experts [S] on w's device, in one launch that reads the ids on the device (no host sync: graph-safe).
// Each expert's element count must be a multiple of the blocksize; the ids are not range-checked here.
void dequantize_experts(const ops::WeightTensor& w, const at::Tensor& experts, const at::Tensor& out);

// Columns [k0, k0 + out.size(1)) of a 2-dim nf4 weight [N, K] into out [N, kc] (contiguous, on w's device,
// fp32/bf16/fp16): the operand of a GEMM over a block of K. Bit-exact like dequantize_range.
void dequantize_columns(const ops::WeightTensor& w, int64_t k0, const at::Tensor& out);

// ops::quantize_nf4(w, blocksize, double_quant) for a CUDA tensor `w` (fp32/bf16/fp16): the packed fields
// equal those of the reference on the same device bit for bit.
ops::WeightTensor quantize(const at::Tensor& w, int64_t blocksize, bool double_quant);

// The QLoRA linear: linear.lora (core/include/axengine/ops/linear_lora.hpp) with an nf4 weight [N, K] and
// x in bf16/fp16 on CUDA. The dequantised weight exists only a chunk of rows at a time, inside the call.
at::Tensor linear_forward(const ops::LinearLoraArgs& args);
ops::LinearLoraGrads linear_backward(const ops::LinearLoraArgs& args, const ops::LinearLoraBackwardArgs& bwd);

}  // namespace ax::nf4
