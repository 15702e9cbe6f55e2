// Checking a model directory against a run before loading it: what `axengine validate` and `run` (before it
// loads anything) ask of a model family. A family opts in by implementing ModelFamilyCheck beside ModelFamily
// (the built-in decoder families do); a family that does not is still checked at load.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "axengine/model.hpp"
#include "axengine/registry.hpp"

namespace ax {

// What a check learnt about the model, for `validate`'s report and the backend check.
struct ModelCheck {
  std::string family;              // model_type
  std::string summary;             // "qwen3_moe: 2 layers, hidden 64, 6 experts top-2"
  std::vector<std::string> ops;    // kernel op ids its forward calls; empty = unknown (every op is checked)
  int64_t lora_modules = 0;        // modules the LoRA spec (or adapter) puts an adapter on
};

// The optional interface: everything load() would refuse, found from config.json, the checkpoint's headers
// and the adapter files without reading a base weight. Throws UsageError naming the file and key (the same
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
