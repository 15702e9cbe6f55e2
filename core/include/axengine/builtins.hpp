// Registers everything core itself provides (reference kernel backends, model families, dataset types,
// optimizers) into a registry. Called once at start, before plugins load, so a plugin cannot shadow a
// built-in name.
#pragma once
#include "axengine/registry.hpp"

namespace ax {
void register_builtins(Registry& registry);
}
