#include "axengine/builtins.hpp"

#include "data/register.hpp"
#include "models/register.hpp"
#include "ops/aten/register.hpp"
#include "ops/aten/register_fusions.hpp"
#include "ops/reference/register.hpp"
#include "train/executors.hpp"
#include "train/optimizers.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  ops::register_reference_kernels(registry);     // core's ops, each with its `reference` (the oracle)
  ops::register_aten_kernels(registry);          // their production fallback, tried before reference
  ops::register_aten_fusion_kernels(registry);   // the same for rms_norm, swiglu, linear_ce
  models::register_builtin_models(registry);
  data::register_builtin_datasets(registry);
  train::register_builtin_optimizers(registry);
  train::register_builtin_executors(registry);
}

}  // namespace ax
