// nf4_linear's Autograd kernel. It is in C++ because a Python user only loads the .so (there is no Python
// side to call torch.library.register_autograd from). The forward redispatches below autograd to the
// device kernel; the backward is the separate operator nf4_linear_backward (plus a sum for the bias), so
// that AOTAutograd / torch.compile trace the backward as registered operators with Meta kernels, and a
// CUDA graph captures it like any other op. Gradients: x, bias, lora_a, lora_b. The packed weight is frozen
// (QLoRA): codes and the absmax fields never get one.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>

#include "ops.hpp"

namespace ax::nf4::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using LinearSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, int64_t,
                             const OptTensor&, const OptTensor&, double, int64_t, const OptTensor&,
                             const OptTensor&, const OptTensor&, double);
using BackwardSig = Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          c10::SymIntArrayRef, int64_t, const OptTensor&, const OptTensor&, double, int64_t,
                          const OptTensor&, const OptTensor&, double, std::array<bool, 2>);

// Positions of the differentiable arguments in forward()'s argument list (backward returns one entry per
// argument, undefined for the rest).
enum Arg { kX = 0, kBias = 9, kLoraA = 10, kLoraB = 11, kNumArgs = 13 };

// An optional tensor stored in the context's saved tensors as an undefined tensor when absent.
OptTensor opt(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

class Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& codes,
                            const at::Tensor& absmax, c10::SymIntArrayRef shape, int64_t blocksize,
                            const OptTensor& nested_absmax, const OptTensor& nested_code, double offset,
                            int64_t nested_blocksize, const OptTensor& bias, const OptTensor& lora_a,
                            const OptTensor& lora_b, double scaling) {
    // needs_input_grad() counts tensor inputs only (an absent optional is not one): map our positions.
    int64_t edge = 0;
    auto edge_of = [&](bool present) { return present ? edge++ : int64_t{-1}; };
    auto present = [](const OptTensor& t) { return t.has_value() && t->defined(); };
    ctx->saved_data["x_edge"] = edge_of(true);
    edge_of(true);  // codes
    edge_of(true);  // absmax
    edge_of(present(nested_absmax));
    edge_of(present(nested_code));
    ctx->saved_data["bias_edge"] = edge_of(present(bias));
    ctx->saved_data["lora_a_edge"] = edge_of(present(lora_a));
    ctx->saved_data["lora_b_edge"] = edge_of(present(lora_b));

    ctx->save_for_backward({x, codes, absmax, nested_absmax.value_or(at::Tensor()),
                            nested_code.value_or(at::Tensor()), lora_a.value_or(at::Tensor()),
                            lora_b.value_or(at::Tensor())});
    ctx->saved_data["shape"] = shape;
    ctx->saved_data["blocksize"] = blocksize;
    ctx->saved_data["offset"] = offset;
    ctx->saved_data["nested_blocksize"] = nested_blocksize;
    ctx->saved_data["scaling"] = scaling;

    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("axengine::nf4_linear", "").typed<LinearSig>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x, codes, absmax, shape, blocksize, nested_absmax, nested_code, offset, nested_blocksize, bias,
                   lora_a, lora_b, scaling);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    auto needs = [&](const char* key) {
      const int64_t e = ctx->saved_data[key].toInt();
      return e >= 0 && ctx->needs_input_grad(static_cast<size_t>(e));
    };
    const bool need_dx = needs("x_edge");
    const bool need_dlora = needs("lora_a_edge") || needs("lora_b_edge");
    const at::Tensor& grad_y = grad_outputs[0];

    variable_list grads(kNumArgs);
    if (need_dx || need_dlora) {
      static const auto op =
          c10::Dispatcher::singleton().findSchemaOrThrow("axengine::nf4_linear_backward", "").typed<BackwardSig>();
      const std::vector<c10::SymInt> shape = ctx->saved_data["shape"].toSymIntVector();
      auto [dx, da, db] = op.call(grad_y, x, saved[1], saved[2], shape, ctx->saved_data["blocksize"].toInt(),
                                  opt(saved[3]), opt(saved[4]), ctx->saved_data["offset"].toDouble(),
                                  ctx->saved_data["nested_blocksize"].toInt(), opt(saved[5]), opt(saved[6]),
                                  ctx->saved_data["scaling"].toDouble(), {need_dx, need_dlora});
      if (need_dx) grads[kX] = dx;
      if (needs("lora_a_edge")) grads[kLoraA] = da;
      if (needs("lora_b_edge")) grads[kLoraB] = db;
    }
    // The bias's gradient is the sum of grad_y over every row; summed in ATen so a trace sees it as it is.
    if (needs("bias_edge")) grads[kBias] = grad_y.dim() == 1 ? grad_y : grad_y.flatten(0, -2).sum(0);
    return grads;
  }
};

}  // namespace

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& absmax,
                           c10::SymIntArrayRef shape, int64_t blocksize, const OptTensor& nested_absmax,
                           const OptTensor& nested_code, double offset, int64_t nested_blocksize,
                           const OptTensor& bias, const OptTensor& lora_a, const OptTensor& lora_b,
                           double scaling) {
  return Nf4LinearFunction::apply(x, codes, absmax, shape, blocksize, nested_absmax, nested_code, offset,
                                  nested_blocksize, bias, lora_a, lora_b, scaling);
}

}  // namespace ax::nf4::torch_ops
