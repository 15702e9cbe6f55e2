#include "axengine/builtins.hpp"

#include "models/register.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  // each area adds its registration call here as it lands
  models::register_builtin_models(registry);
}

}  // namespace ax
