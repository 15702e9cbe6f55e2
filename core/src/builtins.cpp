#include "axengine/builtins.hpp"

#include "ops/reference/register.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  ops::register_reference_kernels(registry);
}

}  // namespace ax
