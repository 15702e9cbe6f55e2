// Registers the built-in model families (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral) as "model" providers keyed by
// config.json's model_type. Called from ax::register_builtins.
#pragma once
#include <memory>

#include "axengine/model.hpp"
#include "axengine/registry.hpp"
#include "models/layer_residency.hpp"

namespace ax::models {
void register_builtin_models(Registry& registry);

// load_model (axengine/models.hpp) handing each decoder layer to `layers` as soon as the load holds it
// (LayerResidency::take_layer), which then holds the layers between uses ([distributed] shard_base). Only
// core's decoder families (DecoderModel) can: for any other family (qwen2_5_vl, a plugin's) nothing is read
// and the result is null.
std::unique_ptr<Model> load_model(const Registry& registry, const ModelLoadOptions& options,
                                  std::shared_ptr<LayerResidency> layers);
}  // namespace ax::models
