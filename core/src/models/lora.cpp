#include "models/lora.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/hub_cache.hpp"
#include "axengine/log.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "models/family.hpp"
#include "models/lora_all_linear.hpp"
#include "models/vision_lora.hpp"
#include "models/hf_config.hpp"

namespace ax::models {
namespace fs = std::filesystem;
using nlohmann::json;

bool lora_name_matches(const std::string& path, const std::string& target) {
  return path == target || (path.size() > target.size() && path.compare(path.size() - target.size(), target.size(), target) == 0 &&
                            path[path.size() - target.size() - 1] == '.');
}

namespace {

// peft's _MOE_TARGET_MODULE_MAPPING / _MOE_FUSED_TARGETS (peft/utils/transformers_weight_conversion.py):
// the transformers 4 per-expert names (the family's, models/family.hpp) and the fused parameter each maps to.
struct MoeNames {
  std::vector<std::string> gate_up;  // both needed
  std::string down;
};
std::optional<MoeNames> moe_names(const std::string& model_type) {
  const Family* f = find_family(model_type);
  if (!f || !f->per_expert) return std::nullopt;
  return MoeNames{{f->per_expert->gate, f->per_expert->up}, f->per_expert->down};
}

double scaling_of(double alpha, int64_t r, bool rslora) { return rslora ? alpha / std::sqrt(double(r)) : alpha / double(r); }

}  // namespace

const LoraModule* LoraSet::find(const std::string& path) const {
  for (const auto& m : modules)
    if (m.site.path == path) return &m;
  return nullptr;
}

bool is_all_linear(const std::vector<std::string>& targets) {
  if (targets.size() != 1) return false;
  std::string t = targets[0];
  for (auto& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return t == kAllLinear;
}

AllLinear resolve_all_linear(const std::string& model_type, const std::vector<LoraSite>& sites) {
  AllLinear out;
  std::set<std::string> seen;
  auto add = [&](const std::string& t) {
    if (seen.insert(t).second) out.targets.push_back(t);
  };
  bool has_experts = false;
  // peft's MoE conversion (experts and routers) is for the families whose experts were nn.Linear modules in
  // transformers 4 (their per-expert names); gpt_oss's experts and router never were: all-linear leaves them.
  const Family* f = find_family(model_type);
  const bool converted = f && f->per_expert;
  for (const auto& s : sites) {
    // A site peft knows under another path is the language model of a multimodal model (qwen2_5_vl): peft's
    // all-linear also takes its vision tower's linear layers, which have no LoRA site here.
    if (!s.peft_path.empty() && out.not_supported.empty()) out.not_supported.push_back("the vision tower (visual.*)");
    if (s.experts) {
      has_experts = true;
      // The router of the layer: peft targets its weight by the transformers 4 module name `gate`.
      if (converted && s.leaf == "gate_up_proj")
        out.not_supported.push_back(s.path.substr(0, s.path.rfind("experts.")) + "gate.weight");
      continue;
    }
    add(s.leaf);  // every linear module but lm_head (which has no site)
  }
  if (has_experts && converted)  // peft's MoE conversion: the experts by their transformers 4 names
    for (const std::string* n : {&f->per_expert->gate, &f->per_expert->up, &f->per_expert->down}) add(*n);
  return out;
}

std::vector<LoraPlan> plan_lora(const LoraSpec& spec_in, const std::string& model_type, const std::vector<LoraSite>& sites) {
  LoraSpec spec = spec_in;
  if (spec.r <= 0) throw UsageError(str("lora: r must be positive, got ", spec.r));
  if (spec.dropout < 0 || spec.dropout >= 1) throw UsageError(str("lora: dropout must be in [0, 1), got ", spec.dropout));
  if (spec.targets.empty()) throw UsageError("lora: no target modules given");
  // A vision-language family plans its vision side itself (models/vision_lora.hpp) and passes the language
  // model's spec without them: here they reach a model that has no vision side.
  if (const auto& vision = spec.vision_targets; !vision.empty())
    throw UsageError(str("lora: vision_targets [", join(vision, ", "), "] given, but this ", model_type,
                         " model has no vision side (lora.vision_targets is for the vision-language families)"));
  if (is_all_linear(spec.targets)) {
    const AllLinear all = resolve_all_linear(model_type, sites);
    if (!all.not_supported.empty()) {
      const std::size_t shown = std::min<std::size_t>(all.not_supported.size(), 3);
      throw UsageError(str("lora: targets \"all-linear\" on this ", model_type, " model: peft resolves it to [",
                           join(all.targets, ", "), "] and also ",
                           join(std::vector<std::string>(all.not_supported.begin(), all.not_supported.begin() + shown), ", "),
                           all.not_supported.size() > shown ? str(" and ", all.not_supported.size() - shown, " more") : "",
                           ", which axengine puts no LoRA on; give the targets as a list instead (those of the list above "
                           "select the same modules without ", all.not_supported.front().find("gate.weight") != std::string::npos
                                                                    ? "the routers)" : "the vision tower; lora.vision_targets names its linear layers)"));
    }
    spec.targets = all.targets;
  }
  std::set<std::string> linear_targets(spec.targets.begin(), spec.targets.end());
  bool gate_up = false, down = false;
  int64_t gate_up_mult = 1;
  bool has_experts = false;
  for (const auto& s : sites) has_experts |= s.experts;
  if (has_experts) {
    auto names = moe_names(model_type);
    if (names) {
      int hits = 0;
      for (const auto& n : names->gate_up)
        if (linear_targets.erase(n)) ++hits;
      if (hits == 1)
        throw UsageError(str("lora: targets ", join(names->gate_up, " and "),
                             " must be given together on this MoE model: they are fused into experts.gate_up_proj"));
      if (hits == 2) gate_up = true, gate_up_mult = 2;
      if (linear_targets.erase(names->down)) down = true;
    }
    if (linear_targets.erase("gate_up_proj") || linear_targets.erase("experts.gate_up_proj") ||
        linear_targets.erase("mlp.experts.gate_up_proj"))
      gate_up = true;
    // transformers 5 parameter names work on every MoE family (Mixtral's own expert names are w1/w2/w3). A bare
    // "down_proj" is the experts' where peft converts the family's targets (per_expert names) or where no other
    // module has that name (gpt_oss); where one does (qwen3_5_moe's shared expert) it is that module's, as in peft.
    bool dense_down = false;
    for (const auto& s : sites) dense_down |= !s.experts && s.leaf == "down_proj";
    if (((names || !dense_down) && linear_targets.erase("down_proj")) || linear_targets.erase("experts.down_proj") ||
        linear_targets.erase("mlp.experts.down_proj"))
      down = true;
    // peft converts every target that ends in ".<per-expert name>" to the experts too, whatever precedes it: a
    // dotted one (shared_expert.gate_proj, or mlp.gate_proj for mlp_only_layers) would put an adapter on a module
    // that peft, loading it, takes for the experts'.
    if (names)
      for (const auto& t : linear_targets)
        for (const std::string& n : {names->gate_up[0], names->gate_up[1], names->down})
          if (t.size() > n.size() + 1 && t.compare(t.size() - n.size() - 1, n.size() + 1, "." + n) == 0)
            throw UsageError(str("lora: target '", t, "' on this ", model_type, " model: peft converts every target ending in '",
                                 n, "' to the routed experts (transformers' MoE conversion), so no other module of that name "
                                 "can carry an adapter peft loads; target '", n, "' for the experts"));
  }
  std::vector<LoraPlan> out;
  std::set<std::string> used;
  for (const auto& s : sites) {
    if (s.experts) {
      if ((s.leaf == "gate_up_proj" && gate_up) || (s.leaf == "down_proj" && down)) {
        int64_t mult = s.leaf == "gate_up_proj" ? gate_up_mult : 1;
        out.push_back({s, spec.r * mult, spec.alpha * double(mult)});
      }
      continue;
    }
    for (const auto& t : linear_targets)
      if (lora_name_matches(s.path, t)) {
        out.push_back({s, spec.r, spec.alpha});
        used.insert(t);
        break;
      }
  }
  for (const auto& t : linear_targets)
    if (!used.count(t)) {
      std::vector<std::string> leaves;
      for (const auto& s : sites) leaves.push_back(s.leaf);
      std::string hint = closest(t, leaves);
      throw UsageError(str("lora: target '", t, "' matches no module of this ", model_type, " model",
                           hint.empty() ? std::string() : str(" (did you mean '", hint, "'?)")));
    }
  for (const auto& p : out)
    if (p.site.experts && spec.dropout > 0)
      throw UsageError(str("lora: dropout ", spec.dropout, " is not supported on expert weights (", p.site.path,
                           "); peft's ParamWrapper has no dropout either"));
  if (out.empty()) throw UsageError("lora: the targets select no module");
  return out;
}

static std::string peft_key_for(const LoraSite& s, bool both_expert_params_targeted) {
  // peft nests one ParamWrapper per targeted parameter of the experts module, in parameter order
  // (gate_up_proj inner, down_proj outer): the inner one's keys gain ".base_layer".
  // A multimodal checkpoint's sites sit under peft's model.language_model. (peft_path), experts included.
  const std::string& path = s.peft_path.empty() ? s.path : s.peft_path;
  if (!s.experts) return "base_model.model." + path;
  std::string module = path.substr(0, path.rfind('.'));  // ...mlp.experts
  if (s.leaf == "gate_up_proj" && both_expert_params_targeted) return "base_model.model." + module + ".base_layer";
  return "base_model.model." + module;
}

static void assign_peft_keys(LoraSet& set) {
  std::set<std::string> gate_up_layers, down_layers;
  for (const auto& m : set.modules)
    if (m.site.experts) {
      std::string module = m.site.path.substr(0, m.site.path.rfind('.'));
      (m.site.leaf == "gate_up_proj" ? gate_up_layers : down_layers).insert(module);
    }
  for (auto& m : set.modules) {
    std::string module = m.site.experts ? m.site.path.substr(0, m.site.path.rfind('.')) : "";
    bool both = m.site.experts && gate_up_layers.count(module) && down_layers.count(module);
    m.peft_key = peft_key_for(m.site, both);
  }
}

LoraSet make_lora(const LoraSpec& spec, const std::string& model_type, const std::vector<LoraSite>& sites,
                  at::ScalarType dtype, at::Device device) {
  LoraSet set;
  set.spec = spec;
  set.model_type = model_type;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed);
  at::ScalarType lora_dtype = spec.dtype == "fp32" ? at::kFloat : dtype;
  if (spec.dtype != "fp32" && spec.dtype != "compute")
    throw UsageError(str("lora: dtype must be fp32 or compute, got '", spec.dtype, "'"));
  for (const auto& p : plan_lora(spec, model_type, sites)) {
    LoraModule m;
    m.site = p.site;
    m.r = p.r;
    m.alpha = p.alpha;
    m.scaling = scaling_of(p.alpha, p.r, spec.rslora);
    const int64_t E = p.site.experts ? p.site.num_experts : 1;
    // nn.Linear's kaiming_uniform_(a=sqrt(5)): bound = 1/sqrt(fan_in), fan_in = K (also for peft's [r·E, K]).
    const double bound = 1.0 / std::sqrt(double(p.site.in_features));
    at::Tensor a = at::empty({p.r * E, p.site.in_features}, at::kFloat);
    a.uniform_(-bound, bound, gen);
    m.a = a.to(device, lora_dtype).set_requires_grad(true);
    m.b = at::zeros({p.site.out_features, p.r * E}, at::TensorOptions().dtype(lora_dtype).device(device)).set_requires_grad(true);
    set.modules.push_back(std::move(m));
  }
  assign_peft_keys(set);
  return set;
}

at::Tensor lora_delta(const LoraModule& m) {
  at::Tensor a = m.a.detach().to(at::kFloat), b = m.b.detach().to(at::kFloat);
  if (!m.site.experts) return at::matmul(b, a) * m.scaling;  // [N, K]
  const int64_t E = m.site.num_experts, r = m.r;
  at::Tensor A = a.view({E, r, -1});                        // [E, r, K]
  at::Tensor B = b.view({b.size(0), E, r}).permute({1, 0, 2});  // [E, N, r]
  return at::bmm(B, A) * m.scaling;                         // [E, N, K]
}

// ---------------------------------------------------------------- PEFT format

namespace {

// Our b [N, r·E] (e-major columns) <-> peft's lora_B [N, r·E] (column j·E + e).
at::Tensor b_to_peft(const at::Tensor& b, int64_t E, int64_t r) {
  return b.view({b.size(0), E, r}).permute({0, 2, 1}).reshape({b.size(0), r * E});
}
at::Tensor b_from_peft(const at::Tensor& b, int64_t E, int64_t r) {
  return b.view({b.size(0), r, E}).permute({0, 2, 1}).reshape({b.size(0), E * r});
}

}  // namespace

void save_peft(const LoraSet& lora, const std::string& dir) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> modules, params;
  json rank_pattern = json::object(), alpha_pattern = json::object();
  for (const auto& m : lora.modules) {
    const int64_t E = m.site.experts ? m.site.num_experts : 1;
    tensors.emplace_back(m.peft_key + ".lora_A.weight", m.a.detach());
    tensors.emplace_back(m.peft_key + ".lora_B.weight", m.site.experts ? b_to_peft(m.b.detach(), E, m.r) : m.b.detach());
    (m.site.experts ? params : modules).insert(m.site.leaf);
    if (m.r != lora.spec.r) rank_pattern[str(".*\\.", m.site.leaf)] = m.r;
    if (m.alpha != lora.spec.alpha) alpha_pattern[str(".*\\.", m.site.leaf)] = m.alpha;
  }
  for (const auto& [name, t] : lora.saved) tensors.emplace_back("base_model.model." + name, t.detach());
  // A base from the Hugging Face hub cache is named by its hub ID (and the commit, when not refs/main's), as
  // peft and transformers name it, so the adapter finds its base on any machine; another base by its directory.
  std::string base = lora.base_model, revision;
  if (const std::string id = hub::repo_id_of_snapshot(base); !id.empty()) {
    const auto at = id.find('@');
    base = id.substr(0, at);
    if (at != std::string::npos) revision = id.substr(at + 1);
  }
  json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base.empty() ? json(nullptr) : json(base)},
      {"revision", revision.empty() ? json(nullptr) : json(revision)},
      {"r", lora.spec.r},
      {"lora_alpha", lora.spec.alpha},
      {"lora_dropout", lora.spec.dropout},
      {"use_rslora", lora.spec.rslora},
      {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
      {"target_parameters", params.empty() ? json(nullptr) : json(std::vector<std::string>(params.begin(), params.end()))},
      {"rank_pattern", rank_pattern},
      {"alpha_pattern", alpha_pattern},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", lora.modules_to_save.empty() ? json(nullptr) : json(lora.modules_to_save)},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"lora_bias", false},
  };
  safetensors::save((fs::path(dir) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}}, "adapter");
  safetensors::write_file_atomic((fs::path(dir) / "adapter_config.json").string(), cfg.dump(2) + "\n", "adapter");
}

LoraSet load_peft(const std::string& dir, const std::string& model_type, const std::vector<LoraSite>& sites,
                  at::ScalarType compute_dtype, at::Device device) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  json cfg = read_json_file(cfg_path);
  auto bad = [&](const std::string& key, const std::string& msg) { return UsageError(str(cfg_path, ": '", key, "' ", msg)); };
  if (!cfg.is_object()) throw UsageError(str(cfg_path, ": not a JSON object"));
  // Fields are type-checked before they are read: json's value<T>() throws its own type_error on a mismatch.
  if (cfg.contains("peft_type") && cfg["peft_type"] != "LORA") throw bad("peft_type", "must be LORA");
  for (const char* k : {"use_dora", "fan_in_fan_out", "lora_bias", "use_qalora"})
    if (cfg.contains(k) && cfg[k].is_boolean() && cfg[k].get<bool>()) throw bad(k, "true is not supported");
  if (cfg.contains("bias") && cfg["bias"].is_string() && cfg["bias"] != "none") throw bad("bias", "must be \"none\"");
  for (const char* k : {"layers_to_transform", "layer_replication", "trainable_token_indices"})
    if (cfg.contains(k) && !cfg[k].is_null() && !(cfg[k].is_array() && cfg[k].empty())) throw bad(k, "is not supported");
  if (!cfg.contains("r") || !cfg["r"].is_number_integer()) throw bad("r", "must be an integer");
  if (!cfg.contains("lora_alpha") || !cfg["lora_alpha"].is_number()) throw bad("lora_alpha", "must be a number");
  LoraSpec spec;
  spec.r = cfg["r"].get<int64_t>();
  spec.alpha = cfg["lora_alpha"].get<double>();
  if (cfg.contains("lora_dropout") && !cfg["lora_dropout"].is_null()) {
    if (!cfg["lora_dropout"].is_number()) throw bad("lora_dropout", "must be a number");
    spec.dropout = cfg["lora_dropout"].get<double>();
  }
  if (cfg.contains("use_rslora") && !cfg["use_rslora"].is_null()) {
    if (!cfg["use_rslora"].is_boolean()) throw bad("use_rslora", "must be true or false");
    spec.rslora = cfg["use_rslora"].get<bool>();
  }
  auto names = [&](const char* key) {
    std::vector<std::string> out;
    if (!cfg.contains(key) || cfg[key].is_null()) return out;
    if (cfg[key].is_string()) throw bad(key, "as a regular expression is not supported; give a list of module names");
    if (!cfg[key].is_array()) throw bad(key, "must be a list of names");
    for (const auto& v : cfg[key]) {
      if (!v.is_string()) throw bad(key, "must be a list of names");
      out.push_back(v.get<std::string>());
    }
    return out;
  };
  spec.targets = names("target_modules");
  const std::vector<std::string> to_save = names("modules_to_save");
  for (const auto& p : names("target_parameters")) {
    std::string leaf = p.substr(p.rfind('.') + 1);
    if (leaf != "gate_up_proj" && leaf != "down_proj")
      throw bad("target_parameters", str("'", p, "' is not an expert parameter this engine knows"));
    spec.targets.push_back(leaf == "down_proj" ? "experts.down_proj" : "gate_up_proj");
  }
  auto patterns = [&](const char* key) {
    std::vector<std::pair<std::regex, double>> out;
    if (!cfg.contains(key) || cfg[key].is_null()) return out;
    if (!cfg[key].is_object()) throw bad(key, "must be an object");
    for (auto it = cfg[key].begin(); it != cfg[key].end(); ++it) {
      if (!it.value().is_number()) throw bad(key, str("value for '", it.key(), "' must be a number"));
      try {
        out.emplace_back(std::regex(it.key()), it.value().get<double>());
      } catch (const std::regex_error&) {
        throw bad(key, str("'", it.key(), "' is not a valid regular expression"));
      }
    }
    return out;
  };
  auto rank_pattern = patterns("rank_pattern");
  for (const auto& [re, v] : rank_pattern)  // a rank becomes an int64 tensor size: no fractions, no overflow
    if (!(v >= 1 && v <= (1 << 20)) || v != std::floor(v)) throw bad("rank_pattern", str("ranks must be integers in [1, 2^20], got ", v));
  auto alpha_pattern = patterns("alpha_pattern");

  auto file = safetensors::File::open(st_path);
  LoraSet set;
  set.spec = spec;
  set.model_type = model_type;
  // Plan with the config's names; the per-module rank then comes from the tensors, checked against the
  // patterns (peft matches rank_pattern keys against the module path, first match wins; fullmatch on
  // the key or a suffix starting at a dot, so ".*\.x" matches).
  for (const auto& p : plan_lora(spec, model_type, sites)) {
    LoraModule m;
    m.site = p.site;
    m.r = spec.r;
    m.alpha = spec.alpha;
    for (const auto& [re, v] : rank_pattern)
      if (std::regex_match(p.site.path, re)) { m.r = int64_t(v); break; }
    for (const auto& [re, v] : alpha_pattern)
      if (std::regex_match(p.site.path, re)) { m.alpha = v; break; }
    m.scaling = scaling_of(m.alpha, m.r, spec.rslora);
    set.modules.push_back(std::move(m));
  }
  assign_peft_keys(set);
  std::set<std::string> consumed;
  at::ScalarType lora_dtype = at::kFloat;
  for (auto& m : set.modules) {
    const int64_t E = m.site.experts ? m.site.num_experts : 1;
    auto fetch = [&](std::string key, std::vector<int64_t> shape) {
      const auto* info = file->find(key);
      // An adapter peft saved against the transformers 4 module tree names the module by its path.
      if (!info && !m.site.peft_path.empty() && key.rfind(m.peft_key, 0) == 0) {
        const std::string legacy = "base_model.model." + m.site.path + key.substr(m.peft_key.size());
        if ((info = file->find(legacy))) key = legacy;
      }
      if (!info) throw UsageError(str(st_path, ": missing tensor '", key, "' for ", m.site.path));
      if (info->shape != shape)
        throw UsageError(str(st_path, ": tensor '", key, "' has shape [", join([&] {
          std::vector<std::string> v; for (auto d : info->shape) v.push_back(std::to_string(d)); return v; }(), ", "),
                             "], expected [", join([&] { std::vector<std::string> v; for (auto d : shape) v.push_back(std::to_string(d)); return v; }(), ", "),
                             "] (r=", m.r, ")"));
      consumed.insert(key);
      at::Tensor t = file->get(key);
      if (t.scalar_type() != at::kFloat && t.scalar_type() != compute_dtype) t = t.to(at::kFloat);
      lora_dtype = t.scalar_type();
      return t;
    };
    at::Tensor a = fetch(m.peft_key + ".lora_A.weight", {m.r * E, m.site.in_features});
    at::Tensor b = fetch(m.peft_key + ".lora_B.weight", {m.site.out_features, m.r * E});
    if (m.site.experts) b = b_from_peft(b, E, m.r);
    m.a = a.to(device).set_requires_grad(true);
    m.b = b.contiguous().to(device).set_requires_grad(true);
  }
  set.spec.dtype = lora_dtype == at::kFloat ? "fp32" : "compute";
  set.modules_to_save = to_save;
  const std::string prefix = "base_model.model.";
  for (const auto& t : file->tensors()) {
    if (consumed.count(t.name) || t.name.rfind(prefix, 0) != 0) continue;
    const std::string name = t.name.substr(prefix.size());
    const std::string module = name.substr(0, name.rfind('.'));
    for (const auto& e : to_save)
      if (module == e || (module.size() > e.size() && module.compare(module.size() - e.size() - 1, e.size() + 1, "." + e) == 0)) {
        set.saved[name] = file->get(t.name).to(device);
        consumed.insert(t.name);
        break;
      }
  }
  for (const auto& t : file->tensors())
    if (!consumed.count(t.name))
      throw UsageError(str(st_path, ": tensor '", t.name, "' belongs to no module the adapter config targets"));
  log::info(str("loaded LoRA adapter ", dir, ": ", set.modules.size(), " modules, r=", spec.r));
  return set;
}

}  // namespace ax::models
