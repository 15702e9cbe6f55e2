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

class OptimizerProvider {
 public:
  virtual ~OptimizerProvider() = default;
  // `options` is the [optimizer] table; unknown keys are a ConfigError.
  virtual std::unique_ptr<Optimizer> create(std::vector<ParamGroup> groups, const toml::table& options) const = 0;
};

}  // namespace ax
