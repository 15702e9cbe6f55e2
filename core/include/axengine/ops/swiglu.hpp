// swiglu — the gated activation of SwiGLU MLPs: y = silu(gate) · up, silu(g) = g · sigmoid(g).
// Contract: docs/ops/swiglu.md. Computed in fp32 and rounded once to the compute dtype.
#pragma once
#include <utility>

#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"

namespace ax::ops {

struct SwigluArgs {
  // Either gate and up, each [*, I] (they may be strided views, e.g. the two halves of one [*, 2I] output),
  // or gate_up [*, 2I] alone, whose first I columns are the gate and last I the up projection (the fused
  // experts' gate_up_proj layout).
  at::Tensor gate, up;
  at::Tensor gate_up;
};

struct SwigluGrads {
  // With gate and up given: dgate and dup, each [*, I]. With gate_up: dgate_up [*, 2I] (contiguous).
  at::Tensor dgate, dup;
  at::Tensor dgate_up;
};

struct SwigluBackwardArgs {
  at::Tensor grad_y;  // [*, I]
};

void validate(const SwigluArgs& args);
// {gate, up} of either input form: the given tensors, or the two [*, I] halves (views) of gate_up.
std::pair<at::Tensor, at::Tensor> gate_and_up(const SwigluArgs& args);
void validate_backward(const SwigluArgs& args, const SwigluBackwardArgs& bwd);

// Determinism: elementwise, so bitwise identical across identical calls.
class Swiglu : public KernelBackend {
 public:
  static constexpr const char* kOp = "swiglu";

  at::Tensor forward(const SwigluArgs& args) {  // [*, I], contiguous
    validate(args);
    return run_forward(args);
  }
  SwigluGrads backward(const SwigluArgs& args, const SwigluBackwardArgs& bwd) {
    validate(args);
    validate_backward(args, bwd);
    return run_backward(args, bwd);
  }

 protected:
  virtual at::Tensor run_forward(const SwigluArgs& args) = 0;
  virtual SwigluGrads run_backward(const SwigluArgs& args, const SwigluBackwardArgs& bwd) = 0;
};

}  // namespace ax::ops
