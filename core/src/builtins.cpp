#include "axengine/builtins.hpp"

namespace ax {

void register_builtins(Registry& registry) {
  (void)registry;  // each area adds its registration call here as it lands
}

}  // namespace ax
