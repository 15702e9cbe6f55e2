// Reference linear.lora: y = x·Wᵀ + bias + s·(x·Aᵀ)·Bᵀ in fp32, W dequantised whole.
//   dX = G·W + s·(G·B)·A,   dA = s·(G·B)ᵀ·X,   dB = s·Gᵀ·(X·Aᵀ)    (G = dY; B·A is never formed)
#include <memory>

#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

class ReferenceLinearLora final : public LinearLora {
 protected:
  at::Tensor run_forward(const LinearLoraArgs& a) override {
    const auto ct = ref::compute_type(a.x.scalar_type());
    const int64_t K = a.weight.shape[1], N = a.weight.shape[0];
    at::Tensor x = a.x.reshape({-1, K}).to(ct);
    at::Tensor w = dequantize(a.weight, ct);  // [N, K]
    at::Tensor y = at::matmul(x, w.t());
    if (a.bias.defined()) y = y + a.bias.to(ct);
    if (a.lora_a.defined()) y = y + a.scaling * at::matmul(at::matmul(x, a.lora_a.to(ct).t()), a.lora_b.to(ct).t());
    auto shape = a.x.sizes().vec();
    shape.back() = N;
    return ref::emit(y.reshape(shape), a.x.scalar_type(), a.out);
  }

  LinearLoraGrads run_backward(const LinearLoraArgs& a, const LinearLoraBackwardArgs& b) override {
    const auto dt = a.x.scalar_type();
    const auto ct = ref::compute_type(dt);
    const int64_t K = a.weight.shape[1], N = a.weight.shape[0];
    at::Tensor x = a.x.reshape({-1, K}).to(ct);
    at::Tensor g = b.grad_y.reshape({-1, N}).to(ct);
    const bool lora = a.lora_a.defined();
    at::Tensor A = lora ? a.lora_a.to(ct) : at::Tensor(), B = lora ? a.lora_b.to(ct) : at::Tensor();
    at::Tensor gB = lora ? at::matmul(g, B) : at::Tensor();  // [rows, r]
    LinearLoraGrads out;
    if (b.need_dx) {
      at::Tensor dx = at::matmul(g, dequantize(a.weight, ct));
      if (lora) dx = dx + a.scaling * at::matmul(gB, A);
      out.dx = ref::emit(dx.reshape(a.x.sizes()), dt, b.out.dx);
    }
    if (lora && b.need_dlora) {
      out.dlora_a = ref::emit(a.scaling * at::matmul(gB.t(), x), dt, b.out.dlora_a);
      out.dlora_b = ref::emit(a.scaling * at::matmul(g.t(), at::matmul(x, A.t())), dt, b.out.dlora_b);
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<LinearLora> make_reference_linear_lora() { return std::make_shared<ReferenceLinearLora>(); }

}  // namespace ax::ops
