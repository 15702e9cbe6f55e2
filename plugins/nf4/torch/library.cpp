// The TORCH_LIBRARY registration of the nf4 plugin: torch.ops.axengine.nf4_dequantize, nf4_linear and
// nf4_linear_backward, with their kernels per dispatch key (ops.hpp). Loading axengine_nf4.so
// (torch.ops.load_library) runs it; so does the engine loading the plugin, harmlessly. The schemas are the
// Python API: argument names and defaults are documented in docs/plugins/nf4-python.md, mirroring
// bitsandbytes' QuantState fields. The weight's shape is SymInt[] so a traced caller may pass sizes it
// derived from tensors; the CPU/CUDA kernels receive them as plain integers.
#include <torch/library.h>

#include "ops.hpp"

namespace {

// The nf4 weight, in every schema, in this order and with these names (bnb: Params4bit.data and QuantState).
#define AX_NF4_WEIGHT "Tensor codes, Tensor absmax, SymInt[] shape, int blocksize"
#define AX_NF4_NESTED "Tensor? nested_absmax=None, Tensor? nested_code=None, float offset=0.0, int nested_blocksize=256"
// The same without defaults, for nf4_linear_backward (arguments follow them that have none).
#define AX_NF4_NESTED_REQUIRED "Tensor? nested_absmax, Tensor? nested_code, float offset, int nested_blocksize"

}  // namespace

TORCH_LIBRARY(axengine, m) {
  // All three are functional (no aliasing, no mutation) and deterministic for identical inputs.
  m.def("nf4_dequantize(" AX_NF4_WEIGHT ", ScalarType dtype, " AX_NF4_NESTED ") -> Tensor");
  m.def("nf4_linear(Tensor x, " AX_NF4_WEIGHT ", " AX_NF4_NESTED
        ", Tensor? bias=None, Tensor? lora_a=None, Tensor? lora_b=None, float scaling=1.0) -> Tensor");
  // output_mask: [grad_x wanted, grad_lora_a and grad_lora_b wanted]; what is not wanted comes back empty ([0]).
  m.def("nf4_linear_backward(Tensor grad_y, Tensor x, " AX_NF4_WEIGHT ", " AX_NF4_NESTED_REQUIRED
        ", Tensor? lora_a, Tensor? lora_b, float scaling, bool[2] output_mask) -> (Tensor grad_x, Tensor grad_lora_a, "
        "Tensor grad_lora_b)");
}

TORCH_LIBRARY_IMPL(axengine, CPU, m) {
  m.impl("nf4_dequantize", TORCH_FN(ax::nf4::torch_ops::dequantize_kernel));
  m.impl("nf4_linear", TORCH_FN(ax::nf4::torch_ops::linear_kernel));
  m.impl("nf4_linear_backward", TORCH_FN(ax::nf4::torch_ops::linear_backward_kernel));
}

// The same functions: they pick the plugin's CUDA kernels by the tensors' device (kernels.cpp).
TORCH_LIBRARY_IMPL(axengine, CUDA, m) {
  m.impl("nf4_dequantize", TORCH_FN(ax::nf4::torch_ops::dequantize_kernel));
  m.impl("nf4_linear", TORCH_FN(ax::nf4::torch_ops::linear_kernel));
  m.impl("nf4_linear_backward", TORCH_FN(ax::nf4::torch_ops::linear_backward_kernel));
}

TORCH_LIBRARY_IMPL(axengine, Meta, m) {
  m.impl("nf4_dequantize", TORCH_FN(ax::nf4::torch_ops::dequantize_meta));
  m.impl("nf4_linear", TORCH_FN(ax::nf4::torch_ops::linear_meta));
  m.impl("nf4_linear_backward", TORCH_FN(ax::nf4::torch_ops::linear_backward_meta));
}

// nf4_dequantize has no gradient (its inputs are integer codes and frozen scales) and nf4_linear_backward is
// not differentiated again: neither gets an Autograd kernel.
TORCH_LIBRARY_IMPL(axengine, Autograd, m) {
  m.impl("nf4_linear", TORCH_FN(ax::nf4::torch_ops::linear_autograd));
}
