#include "axengine/builtins.hpp"

#include "models/register.hpp"
#include "ops/reference/register.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  ops::register_reference_kernels(registry);
  models::register_builtin_models(registry);
}

}  // namespace ax
