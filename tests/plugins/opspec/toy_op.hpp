// toy.scaled_add — an op core does not know, defined by the test plugin toy_plugin.cpp:
//
//   y = x + alpha · z            dx = g,   dz = alpha · g
//
// The interface follows core's op convention (docs/ops/README.md): public forward/backward validate and
// call the backend's protected run_* methods; `out` is an optional preallocated output.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include <axengine/error.hpp>
#include <axengine/kernel_op.hpp>

namespace toy {

struct ScaledAddArgs {
  at::Tensor x, z;  // same shape, same float dtype, same device
  double alpha = 1.0;
  at::Tensor out;  // optional preallocated y
};

struct ScaledAddGrads {
  at::Tensor dx, dz;
};

inline void require(bool ok, const std::string& argument, const std::string& what) {
  if (!ok) throw ax::UsageError("toy.scaled_add: " + argument + ": " + what);
}

inline void validate(const ScaledAddArgs& a) {
  require(a.x.defined() && at::isFloatingType(a.x.scalar_type()), "x", "must be a float tensor");
  require(a.z.defined() && a.z.sizes() == a.x.sizes(), "z", "must have x's shape");
  require(a.z.scalar_type() == a.x.scalar_type() && a.z.device() == a.x.device(), "z", "must have x's dtype and device");
  if (a.out.defined())
    require(a.out.sizes() == a.x.sizes() && a.out.scalar_type() == a.x.scalar_type() && a.out.device() == a.x.device(),
            "out", "must be like x");
}

class ScaledAdd : public ax::KernelBackend {
 public:
  static constexpr const char* kOp = "toy.scaled_add";
  at::Tensor forward(const ScaledAddArgs& a) {
    validate(a);
    return run_forward(a);
  }
  ScaledAddGrads backward(const ScaledAddArgs& a, const at::Tensor& grad_y) {
    validate(a);
    require(grad_y.defined() && grad_y.sizes() == a.x.sizes() && grad_y.scalar_type() == a.x.scalar_type(), "grad_y",
            "must be like x");
    return run_backward(a, grad_y);
  }

 protected:
  virtual at::Tensor run_forward(const ScaledAddArgs& a) = 0;
  virtual ScaledAddGrads run_backward(const ScaledAddArgs& a, const at::Tensor& grad_y) = 0;
};

}  // namespace toy
