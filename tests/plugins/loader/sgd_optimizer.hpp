// A real (if plain) optimizer that the loader's test plugins provide: p -= lr * grad.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "axengine/optimizer.hpp"

namespace ax_test {

class Sgd : public ax::Optimizer {
 public:
  explicit Sgd(std::vector<ax::ParamGroup> groups) : groups_(std::move(groups)) {}
  void step(double lr) override {
    c10::AutoGradMode no_grad(false);
    for (auto& g : groups_)
      for (auto& p : g.params)
        if (p.grad().defined()) p.sub_(p.grad(), lr);
  }
  void zero_grad() override {
    for (auto& g : groups_)
      for (auto& p : g.params)
        if (p.grad().defined()) p.mutable_grad().zero_();
  }
  std::map<std::string, at::Tensor> state_dict() const override { return {}; }
  void load_state_dict(const std::map<std::string, at::Tensor>&) override {}

 private:
  std::vector<ax::ParamGroup> groups_;
};

struct SgdProvider : ax::OptimizerProvider {
  std::unique_ptr<ax::Optimizer> create(std::vector<ax::ParamGroup> groups, const toml::table&) const override {
    return std::make_unique<Sgd>(std::move(groups));
  }
};

}  // namespace ax_test
