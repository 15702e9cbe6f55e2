// A minimal but complete axengine plugin: a `linear.lora` backend for dense weights on the CPU.
//
//   y  = x·Wᵀ + bias + s·(x·Aᵀ)·Bᵀ
//   dx = g·W + s·(g·B)·A        dA = s·(g·B)ᵀ·x        dB = s·gᵀ·(x·Aᵀ)
//
// computed in fp32 and rounded once to the input dtype (docs/ops/linear.lora.md). It never forms B·A.
// The descriptor declares what it supports; kernel selection uses exactly that, and `axengine
// conformance --plugin axengine_minimal.so` certifies each claim against the reference backend.
#include <ATen/ATen.h>

#include <axengine/ops/linear_lora.hpp>
#include <axengine/plugin.hpp>

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "minimal", "version": "1.0.0",
  "providers": [
    {"kind": "kernel", "op": "linear.lora", "name": "minimal_lora",
     "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["dense"]}}
  ]
})")

namespace {

using ax::ops::LinearLoraArgs;
using ax::ops::LinearLoraBackwardArgs;
using ax::ops::LinearLoraGrads;

// The result in the caller's preallocated tensor when there is one (the contract: write into it and
// return it), else as a fresh tensor of the input dtype.
at::Tensor deliver(const at::Tensor& value, const at::Tensor& out, at::ScalarType dtype) {
  if (out.defined()) return out.copy_(value);
  return value.to(dtype);
}

class MinimalLora final : public ax::ops::LinearLora {
 protected:
  // Inputs arrive validated (shapes, dtypes, devices) but with any strides: ATen handles those.
  at::Tensor run_forward(const LinearLoraArgs& a) override {
    const auto K = a.x.size(-1);
    at::Tensor x = a.x.reshape({-1, K}).to(at::kFloat);
    at::Tensor w = a.weight.values.to(at::kFloat);  // [N, K]
    at::Tensor y = at::matmul(x, w.t());
    if (a.bias.defined()) y = y + a.bias.to(at::kFloat);
    if (a.lora_a.defined())
      y = y + a.scaling * at::matmul(at::matmul(x, a.lora_a.to(at::kFloat).t()), a.lora_b.to(at::kFloat).t());
    auto shape = a.x.sizes().vec();
    shape.back() = w.size(0);
    return deliver(y.view(shape), a.out, a.x.scalar_type());
  }

  LinearLoraGrads run_backward(const LinearLoraArgs& a, const LinearLoraBackwardArgs& b) override {
    const auto K = a.x.size(-1), N = b.grad_y.size(-1);
    const at::ScalarType dt = a.x.scalar_type();
    at::Tensor x = a.x.reshape({-1, K}).to(at::kFloat);
    at::Tensor g = b.grad_y.reshape({-1, N}).to(at::kFloat);
    LinearLoraGrads out;
    at::Tensor gb, A;  // g·B [rows, r], A [r, K]
    const bool lora = a.lora_a.defined();
    if (lora) {
      A = a.lora_a.to(at::kFloat);
      gb = at::matmul(g, a.lora_b.to(at::kFloat));
    }
    if (b.need_dx) {
      at::Tensor dx = at::matmul(g, a.weight.values.to(at::kFloat));
      if (lora) dx = dx + a.scaling * at::matmul(gb, A);
      out.dx = deliver(dx.view(a.x.sizes()), b.out.dx, dt);
    }
    if (lora && b.need_dlora) {
      out.dlora_a = deliver(a.scaling * at::matmul(gb.t(), x), b.out.dlora_a, a.lora_a.scalar_type());
      out.dlora_b = deliver(a.scaling * at::matmul(g.t(), at::matmul(x, A.t())), b.out.dlora_b, a.lora_b.scalar_type());
    }
    return out;
  }
};

}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::LinearLora>("minimal_lora", std::make_shared<MinimalLora>()); }
