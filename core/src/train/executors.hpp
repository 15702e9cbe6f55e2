// Core's built-in step executors (axengine/executor.hpp).
#pragma once
#include "axengine/registry.hpp"

namespace ax::train {
void register_builtin_executors(Registry& registry);
}  // namespace ax::train
