// The linear.lora backend for nf4 weights (the QLoRA linear): nf4::linear_forward / linear_backward
// (linear.cpp). The op's validate() has checked shapes, dtypes and devices before these run.
#include "backends.hpp"
#include "nf4.hpp"

namespace ax::nf4 {
namespace {

class Nf4LinearLora final : public ops::LinearLora {
 protected:
  at::Tensor run_forward(const ops::LinearLoraArgs& a) override { return linear_forward(a); }
  ops::LinearLoraGrads run_backward(const ops::LinearLoraArgs& a, const ops::LinearLoraBackwardArgs& b) override {
    return linear_backward(a, b);
  }
};

}  // namespace

std::shared_ptr<ops::LinearLora> make_linear_lora() { return std::make_shared<Nf4LinearLora>(); }

}  // namespace ax::nf4
