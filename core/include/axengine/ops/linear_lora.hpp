// linear.lora — a frozen linear layer with a LoRA adapter: y = x·Wᵀ + bias + scaling·(x·Aᵀ)·Bᵀ, W dense or
// packed (nf4, mxfp4, nvfp4: QLoRA). Contract: docs/ops/linear.lora.md. The backward never materialises B·A (an [N, K] matrix).
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"
#include "axengine/ops/quant_formats.hpp"

namespace ax::ops {

struct LinearLoraArgs {
  at::Tensor x;         // [*, K]
  WeightTensor weight;  // logical [N, K] (nn.Linear layout); dense, nf4, or mxfp4/nvfp4 blocked along K
  at::Tensor bias;      // optional [N]
  at::Tensor lora_a;    // optional [r, K]
  at::Tensor lora_b;    // optional [N, r]  (both or neither)
  double scaling = 1.0;
  at::Tensor out;       // optional preallocated output [*, N]
};

struct LinearLoraGrads {
  at::Tensor dx;       // like x
  at::Tensor dlora_a;  // like lora_a
  at::Tensor dlora_b;  // like lora_b
};

struct LinearLoraBackwardArgs {
  at::Tensor grad_y;  // [*, N]
  bool need_dx = true;
  bool need_dlora = true;
  LinearLoraGrads out;  // optional preallocated outputs
};

void validate(const LinearLoraArgs& args);
void validate_backward(const LinearLoraArgs& args, const LinearLoraBackwardArgs& bwd);

// Determinism: y, dx, dlora_a, dlora_b bitwise identical across identical calls.
class LinearLora : public KernelBackend {
 public:
  static constexpr const char* kOp = "linear.lora";

  at::Tensor forward(const LinearLoraArgs& args) {
    validate(args);
    return run_forward(args);
  }
  LinearLoraGrads backward(const LinearLoraArgs& args, const LinearLoraBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual at::Tensor run_forward(const LinearLoraArgs& args) = 0;
  virtual LinearLoraGrads run_backward(const LinearLoraArgs& args, const LinearLoraBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
