#include "axengine/builtins.hpp"

#include "data/register.hpp"
#include "models/register.hpp"
#include "ops/aten/register_fusions.hpp"
#include "ops/reference/register.hpp"
#include "train/optimizers.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  ops::register_reference_kernels(registry);
  ops::register_aten_fusion_kernels(registry);  // after the ops it serves are registered
  models::register_builtin_models(registry);
  data::register_builtin_datasets(registry);
  train::register_builtin_optimizers(registry);
}

}  // namespace ax
