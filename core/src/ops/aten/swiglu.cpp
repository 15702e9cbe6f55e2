// The `aten` swiglu: silu in fp32 on a copy of the gate, the product rounded once on store (mul_out casts),
// so forward is three kernels and one fp32 temporary; backward writes dgate/dup (or the two halves of
// dgate_up) straight from fp32 intermediates. Strided gate/up views are read in place.
#include <memory>

#include <ATen/ATen.h>

#include "axengine/ops/swiglu.hpp"

namespace ax::ops {
namespace {

class AtenSwiglu final : public Swiglu {
 protected:
  at::Tensor run_forward(const SwigluArgs& a) override {
    auto [gate, up] = gate_and_up(a);
    at::Tensor act = gate.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    at::silu_(act);
    at::Tensor y = at::empty(gate.sizes(), gate.options());
    return at::mul_out(y, act, up);
  }

  SwigluGrads run_backward(const SwigluArgs& a, const SwigluBackwardArgs& b) override {
    auto [gate, up] = gate_and_up(a);
    const int64_t I = gate.size(-1);
    at::Tensor gf = gate.to(at::kFloat);
    at::Tensor sig = at::sigmoid(gf);
    at::Tensor g = b.grad_y.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    SwigluGrads out;
    at::Tensor dgate, dup;
    if (a.gate_up.defined()) {
      auto sizes = gate.sizes().vec();
      sizes.back() = 2 * I;
      out.dgate_up = at::empty(sizes, gate.options());
      dgate = out.dgate_up.narrow(-1, 0, I);
      dup = out.dgate_up.narrow(-1, I, I);
    } else {
      out.dgate = dgate = at::empty(gate.sizes(), gate.options());
      out.dup = dup = at::empty(gate.sizes(), gate.options());
    }
    at::Tensor silu = gf * sig;
    at::mul_out(dup, g, silu);
    // silu'(x) = σ + silu · (1 − σ), reusing the buffers: sig becomes the derivative, then g · up · silu'.
    at::Tensor d = sig.neg().add_(1.0).mul_(silu).add_(sig);
    at::mul_out(dgate, g.mul_(d), up);
    return out;
  }
};

}  // namespace

std::shared_ptr<Swiglu> make_aten_swiglu() { return std::make_shared<AtenSwiglu>(); }

}  // namespace ax::ops
