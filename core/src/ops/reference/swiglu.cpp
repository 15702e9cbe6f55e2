// Reference swiglu: y = silu(gate) · up in fp32 (fp64 for fp64 inputs), rounded once. For fp32 inputs this
// is transformers' `act_fn(gate_proj(x)) * up_proj(x)` exactly. Backward, with σ = sigmoid(gate):
//   dup   = g · silu(gate)
//   dgate = g · up · σ · (1 + gate · (1 − σ))
#include <memory>

#include "axengine/ops/swiglu.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

class ReferenceSwiglu final : public Swiglu {
 protected:
  at::Tensor run_forward(const SwigluArgs& a) override {
    auto [gate, up] = gate_and_up(a);
    const auto ct = ref::compute_type(gate.scalar_type());
    return (at::silu(gate.to(ct)) * up.to(ct)).to(gate.scalar_type()).contiguous();
  }

  SwigluGrads run_backward(const SwigluArgs& a, const SwigluBackwardArgs& b) override {
    auto [gate, up] = gate_and_up(a);
    const auto dt = gate.scalar_type();
    const auto ct = ref::compute_type(dt);
    at::Tensor gf = gate.to(ct), uf = up.to(ct), g = b.grad_y.to(ct);
    at::Tensor sig = at::sigmoid(gf);
    at::Tensor dup = g * (gf * sig);
    at::Tensor dgate = g * uf * sig * (1.0 + gf * (1.0 - sig));
    SwigluGrads out;
    if (a.gate_up.defined()) {
      out.dgate_up = at::cat({dgate, dup}, -1).to(dt).contiguous();
    } else {
      out.dgate = dgate.to(dt);
      out.dup = dup.to(dt);
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<Swiglu> make_reference_swiglu() { return std::make_shared<ReferenceSwiglu>(); }

}  // namespace ax::ops
