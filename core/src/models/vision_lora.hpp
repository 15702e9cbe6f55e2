// LoRA on a vision-language model's vision side (tower, projector), when `lora.vision_targets` names its modules
// (docs/models.md "LoRA on the vision side").
//
//   targets    LoraSpec::vision_targets (plugin ABI 11): the vision-language families plan them on their vision
//              side; every other family refuses a non-empty list (plan_lora).
//   sites      the vision side's linear layers, from the family's description (VlInspect::linears): `path` the
//              vision view's module name (visual.blocks.0.attn.qkv, vision_tower.encoder.layers.0.mlp.fc1),
//              `peft_path` the module's path in transformers 5's module tree, where peft finds it
//              (model.visual.blocks.0.attn.qkv).
//   VisionLora the adapters of those sites and what a tower calls for each linear layer: the plain ATen linear
//              without an adapter (the frozen path, as before), the linear.lora op through its autograd adapter
//              with one (the decoder's op: the factors train).
//   exclude    adapters hold the language model's and the vision side's target names in one target_modules,
//              and peft matches every name everywhere: exclude_modules (a regex) names the modules those names
//              select in peft's model that carry no adapter here, so that peft wraps exactly ours.
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "axengine/model.hpp"
#include "models/lora.hpp"

namespace ax {
class KernelSet;
}

namespace ax::models {

struct VlInspect;

// peft's target_modules rule: `target` names the module at `path` when it is the path or a dotted suffix of it
// (models/lora.cpp).
bool lora_name_matches(const std::string& path, const std::string& target);

// Every vision-language family here holds its vision side under "model." in transformers 5's module tree
// (model.visual, model.vision_tower, model.multi_modal_projector): the vision view's names with that prefix.
std::string vision_peft_path(const std::string& view_module);

// The vision side's LoRA sites (VlInspect::linears, shapes from VlInspect::vision).
std::vector<LoraSite> vision_lora_sites(const VlInspect& vis);
// The module names of the vision side (every tensor's name without its last component): what a target may name.
std::vector<std::string> vision_modules(const VlInspect& vis);

// The sites `targets` select (as peft matches target_modules: the path or a dotted suffix of it). Throws
// UsageError naming a target that selects no site (with the family's linear layers listed) or that also names a
// module of the vision side without a site (a convolution, an embedding, a norm, the projector's matrix), which
// peft would try to wrap too. `what`: "vision tower", "vision tower or projector"; `family` for messages.
std::vector<LoraSite> select_vision_sites(const std::vector<std::string>& targets, const std::vector<LoraSite>& sites,
                                          const std::vector<std::string>& modules, const std::string& family, const std::string& what);

class VisionLora {
 public:
  VisionLora() = default;
  VisionLora(at::ScalarType dtype, std::shared_ptr<KernelSet> kernels) : dtype_(dtype), kernels_(std::move(kernels)) {}
  // The adapters (sites' paths: the vision view's module names) and the target names they were made from.
  void set(LoraSet lora) { lora_ = std::move(lora); }
  const LoraSet& lora() const { return lora_; }
  bool empty() const { return lora_.modules.empty(); }
  void set_training(bool training) { training_ = training; }
  // x·Wᵀ + bias, plus the adapter of `module` (a vision view module name) when it has one.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const std::string& module) const;
  std::vector<std::pair<std::string, at::Tensor>> parameters() const;  // lora_A / lora_B of each module

 private:
  at::ScalarType dtype_ = at::kFloat;
  std::shared_ptr<KernelSet> kernels_;
  LoraSet lora_;
  bool training_ = false;
};

// exclude_modules for an adapter with target_modules `names` whose modules are `wrapped` (peft paths), in a model
// whose modules a name could select are `known` (peft paths): a regex peft full-matches against module paths
// that selects exactly the known modules the names select and `wrapped` does not hold; "" when there are none.
// Runs of layer indices where every layer is excluded are written \d+ (model\.visual\.blocks\.\d+\.mlp\.fc1).
std::string exclude_regex(const std::vector<std::string>& names, const std::vector<std::string>& known,
                          const std::set<std::string>& wrapped);

// adapter_config.json's exclude_modules as peft applies it: null (nothing), a regex full-matched against the
// module path, or a list of names (the path or a dotted suffix). Throws naming `path` for anything else.
std::function<bool(const std::string&)> adapter_excludes(const nlohmann::json& cfg, const std::string& path);

}  // namespace ax::models
