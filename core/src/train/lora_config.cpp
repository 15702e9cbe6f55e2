#include "train/lora_config.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "data/entry.hpp"
#include "models/hf_config.hpp"
#include "models/lora_all_linear.hpp"

namespace ax::train {
namespace {

void bind_lora(TableBinder& t, LoraConfig& c) {
  LoraSpec& s = c.spec;
  // peft's shorthand is a string, not a list: "all-linear" (models/lora_all_linear.hpp resolves it per family).
  if (const toml::node* n = t.table() ? t.table()->get("targets") : nullptr; n && n->is_string()) {
    const std::string v = n->as_string()->get();
    if (!models::is_all_linear({v}))
      t.fail(n, str("'lora.targets' must be a list of module names or \"all-linear\", not \"", v, "\""));
    s.targets = {v};
    t.accept("targets");
  } else {
    t.field("targets", s.targets, "module names that get an adapter, as peft's target_modules (q_proj ... down_proj; MoE experts: gate_up_proj/down_proj, also as peft's target_parameters mlp.experts.gate_up_proj/mlp.experts.down_proj (gpt_oss), or gate_proj/up_proj/down_proj), or the string \"all-linear\": every linear layer but lm_head, as peft resolves it on the model's family (`inspect` shows it); [] = no adapter (then train.unfrozen_parameters says what trains)");
  }
  t.field("vision_targets", s.vision_targets, "module names of a vision-language model's vision side (tower, projector) that get an adapter too, matched as peft matches target_modules but within the vision side only (qwen3_vl, qwen3_vl_moe: qkv, attn.proj, linear_fc1, linear_fc2 (the blocks' MLP and the mergers; mlp.linear_fc1, merger.linear_fc1, deepstack_merger_list.linear_fc1 for some); gemma3: q_proj, k_proj, v_proj, out_proj, fc1, fc2); the adapter saved makes peft wrap the same modules (docs/models.md \"LoRA on the vision side\"); [] = the vision side stays frozen; refused on a model without such modules");
  t.bounded("r", s.r, 1, 4096, "adapter rank");
  // > 0: alpha = 0 scales the update and its gradients to zero (nothing would train); a negative alpha only flips
  // the sign of B's updates, which peft does not check either but no recipe means.
  t.positive("alpha", s.alpha, "scaling numerator (> 0): the update is (alpha / r) * B A");
  t.field("dropout", s.dropout, "dropout on the adapter's input while training (not on experts, as in peft)");
  t.field("rslora", s.rslora, "rank-stabilised scaling alpha / sqrt(r)");
  t.choice("dtype", s.dtype, {"fp32", "compute"}, "adapter weights (and train.unfrozen_parameters) in fp32 (mixed precision master weights) or in the compute dtype");
  t.field("init_from", c.init_from, "a PEFT adapter directory to continue training instead of a fresh adapter (relative to the config file)");
  if (s.dropout < 0 || s.dropout >= 1) t.fail(t.table() ? t.table()->get("dropout") : nullptr, "'lora.dropout' must be in [0, 1)");
}

LoraConfig defaults() {
  LoraConfig c;
  c.spec.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  c.spec.r = 16;
  c.spec.alpha = 32;
  return c;
}

void bind_lora_section(TableBinder& t, RunConfig&) {
  LoraConfig c = defaults();
  bind_lora(t, c);
}

struct Registrar {
  Registrar() { register_config_section({"lora", "the LoRA adapter that training creates (or continues) on the base model", bind_lora_section}); }
} registrar;

}  // namespace

LoraConfig read_lora_config(const RunConfig& config) {
  LoraConfig c = defaults();
  const toml::node* n = config.document.get("lora");
  TableBinder t(n ? n->as_table() : nullptr, "lora", BindContext{config.file, nullptr});
  bind_lora(t, c);
  c.spec.seed = static_cast<uint64_t>(config.run.seed);
  c.init_from = data::resolve_against(config.dir, c.init_from);
  return c;
}

namespace {

std::string shown(const std::vector<std::string>& v) {
  std::vector<std::string> q;
  for (const auto& s : v) q.push_back("\"" + s + "\"");
  return "[" + join(q, ", ") + "]";
}

// The targets as load_peft plans them: target_modules, and target_parameters' expert projections by leaf name.
std::vector<std::string> adapter_targets(const nlohmann::json& cfg) {
  std::set<std::string> out;
  for (const char* key : {"target_modules", "target_parameters"}) {
    auto it = cfg.find(key);
    if (it == cfg.end() || !it->is_array()) continue;
    for (const auto& v : *it) {
      if (!v.is_string()) continue;
      std::string name = v.get<std::string>();
      if (std::string(key) == "target_parameters") {
        const std::string leaf = name.substr(name.rfind('.') + 1);
        name = leaf == "down_proj" ? "experts.down_proj" : leaf;
      }
      out.insert(name);
    }
  }
  return {out.begin(), out.end()};
}

// What load_peft makes of the stored factors: fp32 stays fp32, the compute dtype stays, anything else becomes fp32.
std::string adapter_dtype(const std::string& dir, const std::string& compute_dtype) {
  const std::string path = (std::filesystem::path(dir) / "adapter_model.safetensors").string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  auto file = safetensors::File::open(path);
  if (file->tensors().empty()) return "";
  const std::string d = file->tensors().front().dtype;
  const std::string compute = compute_dtype == "bf16" ? "BF16" : compute_dtype == "fp16" ? "F16" : "F32";
  return d != "F32" && d == compute ? "compute" : "fp32";
}

}  // namespace

void check_init_from(const RunConfig& config, const LoraConfig& lora, const std::string& compute_dtype) {
  if (lora.init_from.empty()) return;
  const toml::node* n = config.document.get("lora");
  const toml::table* table = n ? n->as_table() : nullptr;
  if (!table) return;
  const std::string cfg_path = (std::filesystem::path(lora.init_from) / "adapter_config.json").string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg_path, ec)) return;
  nlohmann::json adapter;
  try {
    adapter = models::read_json_file(cfg_path);
  } catch (const UsageError&) {
    return;
  }
  if (!adapter.is_object()) return;
  const LoraSpec& s = lora.spec;
  auto refuse = [&](const char* key, const std::string& ours, const std::string& theirs, const char* their_key) {
    config_fail(config.file, table->get(key),
                str("'lora.", key, "' is ", ours, ", but the adapter lora.init_from continues was trained with ", their_key, " = ",
                    theirs, " (", cfg_path, "): a continued adapter keeps its own settings, as peft's "
                    "PeftModel.from_pretrained does; remove lora.", key, " or start a fresh adapter without init_from"));
  };
  auto number = [&](const char* key) -> const nlohmann::json* {
    auto it = adapter.find(key);
    return it != adapter.end() && it->is_number() ? &*it : nullptr;
  };
  if (table->get("r"))
    if (const auto* r = number("r"); r && r->get<double>() != static_cast<double>(s.r)) refuse("r", str(s.r), str(r->get<double>()), "r");
  if (table->get("alpha"))
    if (const auto* a = number("lora_alpha"); a && a->get<double>() != s.alpha)
      refuse("alpha", str(s.alpha), str(a->get<double>()), "lora_alpha");
  if (table->get("dropout")) {
    const auto* d = number("lora_dropout");
    const double theirs = d ? d->get<double>() : 0.0;
    if (theirs != s.dropout) refuse("dropout", str(s.dropout), str(theirs), "lora_dropout");
  }
  if (table->get("rslora")) {
    auto it = adapter.find("use_rslora");
    const bool theirs = it != adapter.end() && it->is_boolean() && it->get<bool>();
    if (theirs != s.rslora) refuse("rslora", s.rslora ? "true" : "false", theirs ? "true" : "false", "use_rslora");
  }
  // The adapter's target_modules hold the language model's and the vision side's names together.
  for (const char* key : {"targets", "vision_targets"})
    if (table->get(key)) {
      std::vector<std::string> ours = s.targets;
      ours.insert(ours.end(), s.vision_targets.begin(), s.vision_targets.end());
      std::sort(ours.begin(), ours.end());
      ours.erase(std::unique(ours.begin(), ours.end()), ours.end());
      const auto theirs = adapter_targets(adapter);
      if (ours != theirs) refuse(key, shown(std::string(key) == "targets" ? s.targets : s.vision_targets), shown(theirs), "target_modules");
      break;
    }
  if (table->get("dtype")) {
    const std::string theirs = adapter_dtype(lora.init_from, compute_dtype);
    // In an fp32 run "compute" is fp32 too.
    const bool same = theirs.empty() || theirs == s.dtype || compute_dtype == "fp32";
    if (!same)
      refuse("dtype", "\"" + s.dtype + "\"", str("\"", theirs, "\" (its stored factors)"), "dtype");
  }
}

}  // namespace ax::train
