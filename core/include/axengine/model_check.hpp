// Checking a model directory against a run before loading it: what `axengine validate` and `run` (before it
// loads anything) ask of a model family. A family opts in by implementing ModelFamilyCheck beside ModelFamily
// (the built-in decoder families do); a family that does not is still checked at load.
#pragma once
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "axengine/model.hpp"
#include "axengine/registry.hpp"

namespace ax {

// One kernel call a model makes: the op and the weight format and layout it asks its KernelSet for ("" where
// the op has none); the dtype is the run's compute dtype.
struct OpCall {
  std::string op;      // "linear.lora"
  std::string format;  // "dense", "nf4", ... for the ops that read a frozen weight
  std::string layout;  // "ENK" (moe.mlp), "sinks" (attention with per-head sinks)
  bool operator==(const OpCall&) const = default;
  auto operator<=>(const OpCall&) const = default;
};

// What a check learnt about the model, for `validate`'s report and the backend check.
struct ModelCheck {
  std::string family;              // model_type
  std::string summary;             // "qwen3_moe: 2 layers, hidden 64, 6 experts top-2"
  // Every kernel call its forward and backward make, for a loss and for logits (generation, eval), derived from
  // the model's structure as the model itself derives what it calls: the plan `validate`, `plugins explain` and
  // kernels.strict resolve. Empty = unknown (every op is checked).
  std::vector<OpCall> ops;
  std::string quantize;            // the weight format load packs the base into with a quantizer ("" = none)
  int64_t lora_modules = 0;        // modules the LoRA spec (or adapter) puts an adapter on
};

// The optional interface: everything load() would refuse, found from config.json, the checkpoint's headers
// (every tensor's presence, dtype and shape against the config) and the adapter files without reading a base
// weight. Throws UsageError naming the file and key (the same
// messages load gives), e.g. a LoRA target that matches no module of the model. A family implements it as a
// second base (class MyFamily : public ModelFamily, public ModelFamilyCheck) and registers itself as the
// ModelFamily; check_model finds the interface with dynamic_cast.
class ModelFamilyCheck {
 public:
  virtual ~ModelFamilyCheck() = default;
  virtual ModelCheck check(const nlohmann::json& hf_config, const ModelLoadOptions& options) const = 0;
};

// load_model's front half (the directory, config.json, generation_config.json, the family), then the
// family's check where it has one. Reads no weights.
ModelCheck check_model(const Registry& registry, const ModelLoadOptions& options);

}  // namespace ax
