// The PyTorch registration of the nf4 plugin: torch.ops.axengine.nf4_dequantize, nf4_linear and
// nf4_linear_backward, with their kernels per dispatch key (ops.hpp). Loading axengine_nf4.so
// (torch.ops.load_library) registers them; so does the engine loading the plugin, harmlessly. The schemas are
// the Python API: argument names and defaults are documented in docs/plugins/nf4-python.md, mirroring
// bitsandbytes' QuantState fields. The weight's shape is SymInt[] so a traced caller may pass sizes it
// derived from tensors; the CPU/CUDA kernels receive them as plain integers.
//
// This is what TORCH_LIBRARY_FRAGMENT(axengine, m) + TORCH_LIBRARY_IMPL would do, written out for two
// reasons: a FRAGMENT, not TORCH_LIBRARY, so that other axengine plugins may add their own axengine::
// operators (TORCH_LIBRARY claims the whole namespace); and a guard, because the macros throw from a static
// initialiser — which aborts the process — when a second copy of this plugin is loaded (the build tree's
// and an installed one, say): that copy now warns and leaves the first one's registration in place.
#include <list>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "ops.hpp"

namespace ax::nf4::torch_ops {
namespace {

// The nf4 weight, in every schema, in this order and with these names (bnb: Params4bit.data and QuantState).
#define AX_NF4_WEIGHT "Tensor codes, Tensor absmax, SymInt[] shape, int blocksize"
#define AX_NF4_NESTED "Tensor? nested_absmax=None, Tensor? nested_code=None, float offset=0.0, int nested_blocksize=256"
// The same without defaults, for nf4_linear_backward (arguments follow them that have none).
#define AX_NF4_NESTED_REQUIRED "Tensor? nested_absmax, Tensor? nested_code, float offset, int nested_blocksize"

void define(torch::Library& m) {
  // All three are functional (no aliasing, no mutation) and deterministic for identical inputs.
  m.def("nf4_dequantize(" AX_NF4_WEIGHT ", ScalarType dtype, " AX_NF4_NESTED ") -> Tensor");
  m.def("nf4_linear(Tensor x, " AX_NF4_WEIGHT ", " AX_NF4_NESTED
        ", Tensor? bias=None, Tensor? lora_a=None, Tensor? lora_b=None, float scaling=1.0) -> Tensor");
  // output_mask: [grad_x wanted, grad_lora_a and grad_lora_b wanted]; what is not wanted comes back empty ([0]).
  m.def("nf4_linear_backward(Tensor grad_y, Tensor x, " AX_NF4_WEIGHT ", " AX_NF4_NESTED_REQUIRED
        ", Tensor? lora_a, Tensor? lora_b, float scaling, bool[2] output_mask) -> (Tensor grad_x, Tensor grad_lora_a, "
        "Tensor grad_lora_b)");
}

// CPU and CUDA: the same functions, which pick the plugin's CUDA kernels by the tensors' device (kernels.cpp).
void device_kernels(torch::Library& m) {
  m.impl("nf4_dequantize", TORCH_FN(dequantize_kernel));
  m.impl("nf4_linear", TORCH_FN(linear_kernel));
  m.impl("nf4_linear_backward", TORCH_FN(linear_backward_kernel));
}

void meta_kernels(torch::Library& m) {
  m.impl("nf4_dequantize", TORCH_FN(dequantize_meta));
  m.impl("nf4_linear", TORCH_FN(linear_meta));
  m.impl("nf4_linear_backward", TORCH_FN(linear_backward_meta));
}

// nf4_dequantize has no gradient (its inputs are integer codes and frozen scales) and nf4_linear_backward is
// not differentiated again: neither gets an Autograd kernel.
void autograd_kernels(torch::Library& m) { m.impl("nf4_linear", TORCH_FN(linear_autograd)); }

class Registration {
 public:
  Registration() {
    if (c10::Dispatcher::singleton().findSchema({"axengine::nf4_dequantize", ""}).has_value()) {
      TORCH_WARN("axengine nf4: the axengine::nf4_* operators are already registered (another copy of "
                 "axengine_nf4.so is loaded); this copy's registration is skipped");
      return;
    }
    add(torch::Library::FRAGMENT, std::nullopt, define);
    add(torch::Library::IMPL, c10::DispatchKey::CPU, device_kernels);
    add(torch::Library::IMPL, c10::DispatchKey::CUDA, device_kernels);
    add(torch::Library::IMPL, c10::DispatchKey::Meta, meta_kernels);
    add(torch::Library::IMPL, c10::DispatchKey::Autograd, autograd_kernels);
  }

 private:
  void add(torch::Library::Kind kind, std::optional<c10::DispatchKey> key, void (*fill)(torch::Library&)) {
    fill(libraries_.emplace_back(kind, "axengine", key, __FILE__, __LINE__));
  }
  std::list<torch::Library> libraries_;  // each deregisters what it registered when the library is unloaded
};

const Registration registration;

}  // namespace
}  // namespace ax::nf4::torch_ops
