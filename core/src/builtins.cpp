#include "axengine/builtins.hpp"

#include "data/register.hpp"
#include "train/optimizers.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  // each area adds its registration call here as it lands
  data::register_builtin_datasets(registry);
  train::register_builtin_optimizers(registry);
}

}  // namespace ax
