// The default "skip when not finite" step of an optimizer that cannot decide it on the device: it reads the
// flag on the host, a sync per step (AdamW overrides it; a plugin optimizer should too).
#include <ATen/ATen.h>

#include "axengine/optimizer.hpp"

namespace ax {

void Optimizer::step(double lr, const at::Tensor& found_inf) {
  if (!found_inf.defined() || found_inf.item<double>() == 0) step(lr);
}

}  // namespace ax
