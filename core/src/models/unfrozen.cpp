#include "models/unfrozen.hpp"

#include <filesystem>
#include <regex>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <set>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/family.hpp"
#include "models/hf_config.hpp"
#include "models/weight_policy.hpp"

namespace ax::models {
namespace {

constexpr const char* kUnfrozenKey = "train.unfrozen_parameters";

// axolotl: re.compile(pattern.replace(".", "\\.")); its "[start:end]" row-range suffix is recognised by
// ^(.+)\[([0-9]*)(?::([0-9]*))?\]$ and is not supported here (a gradient hook on some rows of a tensor).
std::regex unfrozen_regex(const std::string& pattern) {
  static const std::regex range(R"(^(.+)\[([0-9]*)(?::([0-9]*))?\]$)");
  if (std::regex_match(pattern, range))
    throw UsageError(ax::str(kUnfrozenKey, ": '", pattern, "' ends in a row range ([start:end], axolotl's syntax for training some "
                         "rows of a tensor), which is not supported: unfreeze whole tensors"));
  std::string escaped;
  for (char ch : pattern) escaped += ch == '.' ? std::string("\\.") : std::string(1, ch);
  try {
    return std::regex(escaped, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw UsageError(ax::str(kUnfrozenKey, ": '", pattern, "' is not a valid regular expression (", e.what(), ")"));
  }
}

bool unfrozen_matches(const std::regex& re, const std::string& name) {
  return std::regex_search(name, re, std::regex_constants::match_continuous);  // re.match: at the start only
}

std::string parent_module(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

}  // namespace

std::vector<std::string> resolve_unfrozen(const HfConfig& c, const std::map<std::string, ops::WeightFormat>& formats,
                                          const std::vector<std::string>& patterns, const std::vector<LoraPlan>& lora) {
  std::vector<std::regex> res;
  for (const auto& p : patterns) res.push_back(unfrozen_regex(p));
  std::set<std::string> adapted;  // module paths with a LoRA adapter
  for (const auto& l : lora) adapted.insert(l.site.path);
  std::vector<std::string> out;
  std::vector<bool> used(patterns.size(), false);
  for (const auto& [name, shape] : internal_tensors(c)) {
    bool hit = false;
    for (std::size_t i = 0; i < res.size(); ++i)
      if (unfrozen_matches(res[i], name)) used[i] = hit = true;
    if (!hit) continue;
    if (auto f = formats.find(name); f != formats.end() && f->second != ops::WeightFormat::dense)
      throw UsageError(ax::str(kUnfrozenKey, " matches '", name, "', which the base holds packed (", ops::to_string(f->second),
                           "): a packed weight has no dense values to train. Keep it dense with model.skip_modules, or "
                           "narrow the pattern"));
    if (name.find(".mlp.experts.") != std::string::npos)
      throw UsageError(ax::str(kUnfrozenKey, " matches '", name, "', a fused-experts tensor: the moe.mlp op computes no gradient for "
                           "expert weights, so they cannot be unfrozen (train them with LoRA: lora.targets "
                           "gate_up_proj / down_proj)"));
    if (adapted.count(parent_module(name)))
      throw UsageError(ax::str(kUnfrozenKey, " matches '", name, "', whose module ", parent_module(name), " also gets a LoRA adapter "
                           "(lora.targets): train it one way, not both"));
    out.push_back(name);
  }
  for (std::size_t i = 0; i < patterns.size(); ++i)
    if (!used[i])
      throw UsageError(ax::str(kUnfrozenKey, ": '", patterns[i], "' matches no parameter of the ", c.model_type,
                           " model (names as transformers gives them, e.g. model.embed_tokens.weight, "
                           "model.layers.0.input_layernorm.weight", c.tie_word_embeddings ? "; the head is tied to the embeddings" : ", lm_head.weight",
                           "; every '.' is a literal dot and the match starts at the name's beginning)"));
  return out;
}

UnfrozenPlan plan_unfrozen(const ModelLoadOptions& o, const std::vector<std::string>& patterns) {
  UnfrozenPlan out;
  if (patterns.empty()) return out;
  const std::string cfg_path = (std::filesystem::path(o.dir) / "config.json").string();
  const nlohmann::json j = read_json_file(cfg_path);
  const std::string type = j.is_object() && j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (!find_family(type))
    throw UsageError(ax::str(kUnfrozenKey, ": the ", type, " model family trains LoRA adapters only (its base parameters cannot "
                         "be unfrozen)"));
  const HfConfig c = parse_hf_config(j, cfg_path);
  auto ckpt = safetensors::Checkpoint::open_dir(o.dir);
  std::vector<LoraPlan> lora;
  if (o.lora) lora = plan_lora(*o.lora, c.model_type, lora_sites(c));
  if (!o.adapter_dir.empty())
    for (const auto& m : load_peft(o.adapter_dir, c.model_type, lora_sites(c), at::kFloat, at::kCPU).modules)
      lora.push_back({m.site, m.r, m.alpha});
  out.names = resolve_unfrozen(c, held_formats(c, weight_plan(c, o.weights), ckpt), patterns, lora);
  const std::set<std::string> chosen(out.names.begin(), out.names.end());
  for (const auto& [name, shape] : internal_tensors(c))
    if (chosen.count(name)) {
      int64_t n = 1;
      for (auto d : shape) n *= d;
      out.elements += n;
    }
  return out;
}

void check_saved(const HfConfig& c, const std::map<std::string, at::Tensor>& saved, const std::string& source) {
  if (saved.empty()) return;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, shape] : internal_tensors(c)) shapes[name] = shape;
  for (const auto& [name, t] : saved) {
    auto it = shapes.find(name);
    if (it == shapes.end())
      throw UsageError(ax::str(source, ": modules_to_save tensor '", name, "' is no parameter of the ", c.model_type, " model"));
    if (t.sizes().vec() != it->second)
      throw UsageError(ax::str(source, ": modules_to_save tensor '", name, "' has shape ", t.sizes(), ", the model's ",
                           at::IntArrayRef(it->second)));
  }
}

std::vector<std::string> whole_modules(const HfConfig& c, const std::vector<std::string>& names, std::string& partial) {
  const std::set<std::string> chosen(names.begin(), names.end());
  std::vector<std::string> all;
  for (const auto& [name, shape] : internal_tensors(c)) all.push_back(name);
  std::vector<std::string> modules;
  std::set<std::string> seen;
  for (const auto& n : names) {
    const std::string m = parent_module(n);
    // A tied head is the embedding: peft's modules_to_save on it would have to untie the two.
    if (c.tie_word_embeddings && n == "model.embed_tokens.weight") {
      partial = ax::str(n, " (tied to lm_head)");
      return {};
    }
    for (const auto& other : all)
      if (other.size() > m.size() && other.compare(0, m.size() + 1, m + ".") == 0 && !chosen.count(other)) {
        partial = ax::str(n, " (", other, " of the same module stays frozen)");
        return {};
      }
    if (seen.insert(m).second) modules.push_back(m);
  }
  // A module inside another one listed (self_attn.q_proj within self_attn, picked by self_attn.sinks) is saved
  // with it.
  std::vector<std::string> outer;
  for (const auto& m : modules) {
    bool inside = false;
    for (const auto& o : modules) inside |= m.size() > o.size() && m.compare(0, o.size() + 1, o + ".") == 0;
    if (!inside) outer.push_back(m);
  }
  return outer;
}

}  // namespace ax::models
