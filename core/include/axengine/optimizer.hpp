// Optimizers (registry kind "optimizer"). State round-trips through named tensors so checkpoints need
// no optimizer-specific code.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <toml++/toml.h>

namespace ax {

struct ParamGroup {
  std::vector<at::Tensor> params;  // leaf tensors with requires_grad
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;   // the schedule owns the learning rate
  virtual void zero_grad() = 0;
  virtual std::map<std::string, at::Tensor> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, at::Tensor>& state) = 0;  // names the missing key
  // The same step, skipped when `found_inf` (a float scalar on the parameters' device, 0 or 1) is 1: the
  // trainer decides "the gradients are not finite" on the device and never waits for the answer. An
  // optimizer that can skip on the device overrides this; the default reads the flag on the host (a sync).
  virtual void step(double lr, const at::Tensor& found_inf);
};

// An optimizer that can also read its learning rate from a device scalar and keep its step count on the
// device, so that its step can be captured in a CUDA graph and replayed with a new rate (executor.hpp). A
// separate interface (found by dynamic_cast) so that Optimizer's virtual table stays as plugins know it.
// Once an optimizer has stepped this way, a run keeps stepping this way: the count lives on the device.
class DeviceLrOptimizer {
 public:
  virtual ~DeviceLrOptimizer() = default;
  // Whether step_device_lr can be used for these parameters (e.g. AdamW: only with its fused CUDA kernel).
  virtual bool device_lr_supported() const = 0;
  // The step of Optimizer::step(lr, found_inf) with `lr` a float32 scalar on the parameters' device.
  virtual void step_device_lr(const at::Tensor& lr, const at::Tensor& found_inf) = 0;
};

class OptimizerProvider {
 public:
  virtual ~OptimizerProvider() = default;
  // `options` is the [optimizer] table; unknown keys are a ConfigError.
  virtual std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const toml::table& options) const = 0;
};

}  // namespace ax
