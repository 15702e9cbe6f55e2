// Model directories as users handle them: load one through the registry's model families, and the tools
// behind `axengine init-model`, `inspect` and `merge-lora`.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "axengine/model.hpp"
#include "axengine/registry.hpp"

namespace ax {

// Reads options.dir/config.json (and generation_config.json where present), finds the family registered
// for its model_type (UsageError listing the known ones otherwise) and loads the model.
std::unique_ptr<Model> load_model(const Registry& registry, const ModelLoadOptions& options);

// The kind of image processor the model in `dir` reads (its config.json model_type's family description,
// models/vlm.hpp): what DatasetContext::image_processor holds for a run of it. "" for a text-only family, or when
// config.json is missing or gives no model_type (rows with images are then refused, naming what is wrong).
std::string model_image_processor(const std::string& dir);

// init-model presets: tiny-llama, tiny-qwen2, tiny-mistral, tiny-qwen3, tiny-qwen3-moe, tiny-mixtral.
std::vector<std::string> model_presets();
// Writes config.json, generation_config.json, model.safetensors (random init, N(0, 0.02) as HF's
// initializer_range, norms at 1) and a byte-level tokenizer.json. UsageError for an unknown preset.
void init_model_dir(const std::string& preset, const std::string& out_dir, uint64_t seed);

// A human-readable report: architecture, parameter counts (total, active per token), the checkpoint's
// tensors with dtypes and shapes, and the LoRA targets (with the modules each would match).
std::string inspect_model_dir(const std::string& dir);

// Folds a PEFT adapter into the base weights and writes an HF model dir (config.json, model.safetensors,
// plus the tokenizer / generation files copied over, and axengine_merge.json: what was merged into what).
// dtype: "fp32" | "bf16" | "fp16" | "" (as the base). `weights`: the policy the adapter was trained under (a run
// config's [model] keys); nullopt takes it from the adapter's training record (axengine_training.json, which
// `run` writes beside every adapter), which an explicit policy must agree with. A packed (QLoRA) base is packed
// the same way and dequantised, so the adapter is folded into the base it learned against and the result is
// dense. `model_dir` "" = the base the record names. UsageError for a policy or base the record contradicts.
void merge_lora_dir(const Registry& registry, const std::string& model_dir, const std::string& adapter_dir,
                    const std::string& out_dir, const std::string& dtype,
                    const std::optional<WeightPolicy>& weights = std::nullopt);

}  // namespace ax
