// [train] unfrozen_parameters: which base parameters of a decoder model train (full fine-tuning of the matched
// tensors, alone or beside a LoRA adapter), resolved the same way by the pre-flight check and by the load.
//
// Patterns follow axolotl's `unfrozen_parameters` (axolotl.utils.freeze.LayerNamePattern): every '.' is a
// literal dot, the rest is a regular expression (std::regex ECMAScript), matched from the start of the name
// (Python's re.match: anchored at the start, not at the end; add '$' for the whole name). Names are the base
// parameters' as transformers 5 names them (model.embed_tokens.weight, model.layers.0.input_layernorm.weight,
// lm_head.weight; a tied head is model.embed_tokens.weight, as transformers' named_parameters lists it once).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "axengine/model.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "models/hf_config.hpp"
#include "models/lora.hpp"

namespace ax::models {

// The base parameters `patterns` select, in internal_tensors order. Throws UsageError naming the key
// train.unfrozen_parameters and: a pattern that is not a valid regular expression or uses axolotl's row-range
// suffix ([:32000], not supported); a pattern that matches no base parameter; a matched parameter held packed
// (`formats`: held_formats, nf4 / mxfp4 / nvfp4), which has no dense values to train; a fused-experts tensor
// (the moe.mlp op computes no weight gradients); a weight whose module the LoRA plan `lora` adapts too.
std::vector<std::string> resolve_unfrozen(const HfConfig& c, const std::map<std::string, ops::WeightFormat>& formats,
                                          const std::vector<std::string>& patterns, const std::vector<LoraPlan>& lora);

// plan_run's side: resolve_unfrozen on the model directory of `options` (config.json, the checkpoint's headers,
// the formats its weight policy holds, the LoRA plan of its spec or adapter), reading no weight. A model_type
// that is not a built-in decoder family is refused (DecoderModel::unfreeze is what trains base parameters).
struct UnfrozenPlan {
  std::vector<std::string> names;
  int64_t elements = 0;
};
UnfrozenPlan plan_unfrozen(const ModelLoadOptions& options, const std::vector<std::string>& patterns);

// An adapter's modules_to_save tensors (HF name -> values) against the model: each a base parameter of that
// shape, else UsageError naming `source` and the tensor (what DecoderModel::restore_saved refuses at load).
void check_saved(const HfConfig& c, const std::map<std::string, at::Tensor>& saved, const std::string& source);

// Whether `names` (a resolved set) covers every parameter of each module it touches, so that peft can save the
// modules as modules_to_save (whole modules only). Returns the module paths when so; `partial` gets the first
// parameter that leaves its module partly frozen otherwise (and the result is empty).
std::vector<std::string> whole_modules(const HfConfig& c, const std::vector<std::string>& names, std::string& partial);

}  // namespace ax::models
