// Core's dataset types (registry kind "dataset"): `completion` and `pretokenized`.
#pragma once
#include "axengine/registry.hpp"

namespace ax::data {
void register_builtin_datasets(Registry& registry);
}
