// Registers the built-in model families (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral) as "model" providers keyed by
// config.json's model_type. Called from ax::register_builtins.
#pragma once
#include "axengine/registry.hpp"

namespace ax::models {
void register_builtin_models(Registry& registry);
}
