// See loss_scaler.hpp. Each step follows torch/amp/grad_scaler.py (torch 2.11) term for term.
#include "train/loss_scaler.hpp"

#include <map>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::train {

LossScaler::LossScaler(const LossScaleOptions& o, at::Device device) : options_(o) {
  if (!(o.init_scale > 0) || !(o.growth_factor > 1) || !(o.backoff_factor > 0 && o.backoff_factor < 1) || o.growth_interval < 1)
    throw UsageError(str("loss scaling: init_scale > 0, growth_factor > 1, backoff_factor in (0, 1) and growth_interval >= 1 "
                         "are required (got ", o.init_scale, ", ", o.growth_factor, ", ", o.backoff_factor, ", ",
                         o.growth_interval, ")"));
  scale_ = at::full({}, o.init_scale, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({}, at::TensorOptions().dtype(at::kInt).device(device));
}

at::Tensor LossScaler::scale(const at::Tensor& loss) const { return loss * scale_.to(loss.device()); }

at::Tensor LossScaler::unscale(const std::vector<at::Tensor>& grads) const {
  // FP32 division can be imprecise: GradScaler takes the reciprocal in fp64.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found_inf = at::zeros({}, scale_.options());
  // The kernel takes one device and dtype per call, as GradScaler groups them.
  std::map<int, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& g : grads)
    if (g.defined()) by_dtype[static_cast<int>(g.scalar_type())].push_back(g);
  for (auto& [dtype, group] : by_dtype) at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale);
  return found_inf;
}

void LossScaler::update(const at::Tensor& found_inf) {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf.to(scale_.device(), at::kFloat), options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
}

LossScaleState LossScaler::state() const {
  return {scale_.item<float>(), growth_tracker_.item<int32_t>()};
}

void LossScaler::load(const LossScaleState& s) {
  scale_.fill_(s.scale);
  growth_tracker_.fill_(s.growth_tracker);
}

}  // namespace ax::train
