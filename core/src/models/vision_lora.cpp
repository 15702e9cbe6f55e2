// LoRA on the vision side of the vision-language families (models/vision_lora.hpp).
#include "models/vision_lora.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "models/autograd_ops.hpp"
#include "models/vlm.hpp"

namespace ax::models {

std::string vision_peft_path(const std::string& view_module) { return "model." + view_module; }

std::vector<LoraSite> vision_lora_sites(const VlInspect& vis) {
  std::map<std::string, std::vector<int64_t>> shapes(vis.vision.begin(), vis.vision.end());
  std::vector<LoraSite> out;
  for (const auto& m : vis.linears) {
    auto it = shapes.find(m + ".weight");
    if (it == shapes.end() || it->second.size() != 2) throw RuntimeError(str("vision LoRA site '", m, "' has no [out, in] weight"));
    LoraSite s{m, m.substr(m.rfind('.') + 1), false, 1, it->second[1], it->second[0]};
    s.peft_path = vision_peft_path(m);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> vision_modules(const VlInspect& vis) {
  std::vector<std::string> out;
  for (const auto& [name, shape] : vis.vision) {
    const auto dot = name.rfind('.');
    if (dot != std::string::npos) out.push_back(name.substr(0, dot));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<LoraSite> select_vision_sites(const std::vector<std::string>& targets, const std::vector<LoraSite>& sites,
                                          const std::vector<std::string>& modules, const std::string& family, const std::string& what) {
  std::set<std::string> site_paths, leaves;
  for (const auto& s : sites) site_paths.insert(s.path), leaves.insert(s.leaf);
  if (sites.empty())
    throw UsageError(str("lora: vision_targets [", join(targets, ", "), "]: LoRA on the ", what, " is not implemented for ", family,
                         " (its ", what, " stays frozen; leave lora.vision_targets empty)"));
  const std::string offered = str("its linear layers: ", join(std::vector<std::string>(leaves.begin(), leaves.end()), ", "));
  for (const auto& t : targets) {
    bool any = false;
    for (const auto& s : sites) any |= lora_name_matches(s.path, t);
    if (!any) {
      const std::string hint = closest(t, std::vector<std::string>(leaves.begin(), leaves.end()));
      throw UsageError(str("lora: vision target '", t, "' names no linear layer of the ", family, " ", what, " (", offered, ")",
                           hint.empty() ? std::string() : str("; did you mean '", hint, "'?")));
    }
    // peft would wrap every module the name selects: a convolution, an embedding or a norm has no adapter here.
    for (const auto& m : modules)
      if (!site_paths.count(m) && lora_name_matches(m, t))
        throw UsageError(str("lora: vision target '", t, "' also names ", m, ", which is not a linear layer of the ", family, " ", what,
                             " (no LoRA site); name the linear layers by a longer suffix (", offered, ")"));
  }
  std::vector<LoraSite> out;
  for (const auto& s : sites)
    if (std::any_of(targets.begin(), targets.end(), [&](const std::string& t) { return lora_name_matches(s.path, t); })) out.push_back(s);
  return out;
}

at::Tensor VisionLora::linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const std::string& module) const {
  const LoraModule* m = lora_.find(module);
  if (!m) return at::linear(x, weight, bias);  // the frozen path, unchanged
  ops::LinearLoraArgs args;
  args.x = x;
  args.weight = ops::WeightTensor::dense(weight);
  args.bias = bias;
  auto op = kernels_->get<ops::LinearLora>(ops::dtype_name(dtype_), "dense");
  const double p = lora_.spec.dropout;
  if (training_ && p > 0) {  // as the decoder's: dropout on the LoRA branch's input only
    at::Tensor base = autograd::linear_lora(op, std::move(args));
    at::Tensor xd = at::dropout(x.to(m->a.scalar_type()), p, true);
    return base + (at::matmul(at::matmul(xd, m->a.t()), m->b.t()) * m->scaling).to(base.scalar_type());
  }
  args.lora_a = m->a.to(dtype_);
  args.lora_b = m->b.to(dtype_);
  args.scaling = m->scaling;
  return autograd::linear_lora(op, std::move(args));
}

std::vector<std::pair<std::string, at::Tensor>> VisionLora::parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& m : lora_.modules) {
    out.emplace_back(m.site.path + ".lora_A", m.a);
    out.emplace_back(m.site.path + ".lora_B", m.b);
  }
  return out;
}

namespace {

std::string escape_for_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') out += '\\';
    out += c;
  }
  return out;
}

// The escaped path with every all-digit component (a layer index) written \d+.
std::string layer_index_pattern(const std::string& path) {
  std::string out;
  for (std::size_t start = 0; start <= path.size();) {
    std::size_t end = path.find('.', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    start = end + 1;
    if (!out.empty()) out += "\\.";
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    out += digits ? "\\d+" : escape_for_regex(part);
  }
  return out;
}

}  // namespace

std::string exclude_regex(const std::vector<std::string>& names, const std::vector<std::string>& known, const std::set<std::string>& wrapped) {
  std::map<std::string, std::vector<std::string>> excluded, all;  // by index pattern
  for (const auto& k : known) {
    all[layer_index_pattern(k)].push_back(k);
    const bool hit = std::any_of(names.begin(), names.end(), [&](const std::string& n) { return lora_name_matches(k, n); });
    if (hit && !wrapped.count(k)) excluded[layer_index_pattern(k)].push_back(k);
  }
  std::vector<std::string> parts;
  for (const auto& [pattern, paths] : excluded) {
    if (paths.size() == all[pattern].size()) {  // every layer's module of this kind: one pattern
      parts.push_back(pattern);
      continue;
    }
    for (const auto& p : paths) parts.push_back(escape_for_regex(p));
  }
  return join(parts, "|");
}

std::function<bool(const std::string&)> adapter_excludes(const nlohmann::json& cfg, const std::string& path) {
  auto it = cfg.find("exclude_modules");
  if (it == cfg.end() || it->is_null()) return [](const std::string&) { return false; };
  if (it->is_string()) {
    std::regex re;
    try {
      re = std::regex(it->get<std::string>());
    } catch (const std::regex_error&) {
      throw UsageError(str(path, ": 'exclude_modules' ", it->dump(), " is not a valid regular expression"));
    }
    return [re](const std::string& m) { return std::regex_match(m, re); };
  }
  std::vector<std::string> names;
  if (it->is_array())
    for (const auto& v : *it) {
      if (!v.is_string()) throw UsageError(str(path, ": 'exclude_modules' must be a regular expression or a list of module names"));
      names.push_back(v.get<std::string>());
    }
  else
    throw UsageError(str(path, ": 'exclude_modules' must be a regular expression or a list of module names"));
  return [names](const std::string& m) {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return lora_name_matches(m, n); });
  };
}

}  // namespace ax::models
