// Core's optimizers (registry kind "optimizer"): `adamw`.
#pragma once
#include "axengine/config_binder.hpp"
#include "axengine/registry.hpp"

namespace ax::train {

void register_builtin_optimizers(Registry& registry);

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::string implementation = "auto";  // auto | fused | reference
};
void bind_adamw_options(TableBinder& t, AdamWOptions& o);

}  // namespace ax::train
