#include "axengine/selection.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "axengine/strings.hpp"

namespace ax {

namespace {
// Ops whose default order (no config list) starts with a written list (selection.hpp names moe.mlp's; this
// list is the whole set): the fastest backend per GPU first,
// each passed over where it cannot run. A name no loaded plugin provides is skipped with its reason, so the
// list may name backends that are not built yet. Other registered backends follow, `reference` last.
const std::vector<std::string>* default_order(const std::string& op) {
  static const std::map<std::string, std::vector<std::string>> lists = {
      // sonicmoe first where it runs (sm_90, bf16, dense weights): on the H200 its block measured 1.11-1.81x
      // scattermoe's speed at the five bench shapes, in 18-37 % of its peak memory
      // (bench/results/bench-moe-mlp-nvidia-h200-2026-11-29.json, docs/plugins/sonicmoe.md); scattermoe serves
      // everything else (other GPUs, fp16, quantised experts, declines).
      {"moe.mlp", {"sonicmoe", "scattermoe", "reference"}},
      // aten before the gdn plugin: with the chunk-parallel math shared, gdn's scan kernels measured 0.44-0.87x
      // aten's forward + backward time on packed rows but 1.21x on one 16k-row sequence on an H100
      // (bench/results/gdn-bench-fla-nvidia-h100-2026-12-07.md, docs/plugins/gdn.md); gdn moves first when it is
      // ahead at every shape; `[kernels] linear_attention = ["gdn"]` picks it for packed rows today.
      {"linear_attention", {"aten", "gdn", "reference"}},
  };
  auto it = lists.find(op);
  return it == lists.end() ? nullptr : &it->second;
}
}  // namespace

Resolution resolve_backend(const Registry& registry, const KernelPreferences& prefs, const std::string& op,
                           const KernelQuery& query) {
  Resolution res;
  res.op = op;
  res.query = query;
  std::vector<std::string> order;
  auto arch_it = query.device.is_cuda() ? prefs.by_arch.find(query.device.arch) : prefs.by_arch.end();
  if (arch_it != prefs.by_arch.end() && arch_it->second.count(op)) {
    order = arch_it->second.at(op);
    res.list_source = str("[kernels.arch.", query.device.arch_name(), "]");
  } else if (prefs.prefer.count(op)) {
    order = prefs.prefer.at(op);
    res.list_source = "[kernels]";
  } else {
    // Every registered backend: plugins' (by name), then core's production ones (`aten`, by name), then
    // `reference`, the fp32 oracle, last. So a plugin kernel wins over aten and aten over reference. An op
    // the config leaves alone keeps its fallback even in strict mode (strict removes the implicit fallback
    // from the lists the user wrote).
    std::vector<std::string> plugins, builtins;
    for (const Provider* p : registry.list(ProviderKind::kernel, op)) {
      if (p->info.name == "reference") continue;
      (p->info.plugin == "builtin" ? builtins : plugins).push_back(p->info.name);
    }
    std::sort(plugins.begin(), plugins.end());
    std::sort(builtins.begin(), builtins.end());
    order = std::move(plugins);
    order.insert(order.end(), builtins.begin(), builtins.end());
    if (registry.find(ProviderKind::kernel, op, "reference")) order.push_back("reference");
    res.list_source = "default (all registered)";
    if (const auto* d = default_order(op)) {
      // The written order first (missing names stay, to be reported), then every other registered backend
      // in the order above, `reference` last.
      std::vector<std::string> all = std::move(order);
      order.clear();
      for (const auto& n : *d)
        if (n != "reference") order.push_back(n);
      for (const auto& n : all)
        if (std::find(order.begin(), order.end(), n) == order.end() && n != "reference") order.push_back(n);
      order.push_back("reference");
      res.list_source = "default for " + op;
    }
  }
  if (!prefs.strict && std::find(order.begin(), order.end(), "reference") == order.end()) order.push_back("reference");

  for (const auto& name : order) {
    Resolution::Candidate c{name, ""};
    const Provider* p = registry.find(ProviderKind::kernel, op, name);
    if (!p) {
      c.verdict = "not registered (no loaded plugin provides it)";
    } else if (!res.chosen.empty()) {
      c.verdict = str("not tried (", res.chosen, " chosen first)");
      if (!unmet_requirement(p->info.needs, query)) res.fallbacks.push_back(name);
    } else if (auto why = unmet_requirement(p->info.needs, query)) {
      c.verdict = *why;
    } else {
      c.verdict = "chosen";
      res.chosen = name;
    }
    res.candidates.push_back(std::move(c));
  }
  return res;
}

Resolution resolve_quantizer(const Registry& registry, const KernelQuery& query) {
  Resolution res;
  res.op = "quantize";
  res.query = query;
  res.list_source = "registered quantizers";
  std::vector<const Provider*> order;
  for (const Provider* p : registry.list(ProviderKind::quantizer))
    if (p->info.name != "reference") order.push_back(p);
  std::sort(order.begin(), order.end(), [](const Provider* a, const Provider* b) { return a->info.name < b->info.name; });
  if (const Provider* ref = registry.find(ProviderKind::quantizer, "", "reference")) order.push_back(ref);
  for (const Provider* p : order) {
    Resolution::Candidate c{p->info.name, ""};
    if (!res.chosen.empty()) c.verdict = str("not tried (", res.chosen, " chosen first)");
    else if (auto why = unmet_requirement(p->info.needs, query)) c.verdict = *why;
    else {
      c.verdict = "chosen";
      res.chosen = p->info.name;
    }
    res.candidates.push_back(std::move(c));
  }
  return res;
}

KernelSet::KernelSet(const Registry& registry, KernelPreferences prefs, DeviceInfo device)
    : registry_(registry), prefs_(std::move(prefs)), device_(std::move(device)) {}

std::shared_ptr<void> KernelSet::get_backend(const std::string& op, const std::string& dtype, const std::string& format,
                                             const std::string& layout) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [res, obj] : cache_)
    if (res.op == op && res.query.dtype == dtype && res.query.format == format && res.query.layout == layout) return obj;
  Resolution res = resolve_backend(registry_, prefs_, op, KernelQuery{device_, dtype, format, layout});
  if (res.chosen.empty()) {
    std::vector<std::string> why;
    for (const auto& c : res.candidates) why.push_back(str(c.backend, ": ", c.verdict));
    throw UsageError(str("kernels.strict: no backend for ", op, " (dtype ", dtype.empty() ? "any" : dtype,
                         format.empty() ? "" : ", format " + format, ") on ", device_.arch_name(), " — ",
                         why.empty() ? std::string("the list is empty") : join(why, "; ")));
  }
  auto obj = registry_.find(ProviderKind::kernel, op, res.chosen)->object;
  cache_.emplace_back(std::move(res), obj);
  return obj;
}

std::vector<std::pair<std::string, std::shared_ptr<void>>> KernelSet::get_chain(const std::string& op,
                                                                               const std::string& dtype,
                                                                               const std::string& format,
                                                                               const std::string& layout) {
  get_backend(op, dtype, format, layout);  // resolves (or throws) and caches the resolution
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [res, obj] : cache_)
    if (res.op == op && res.query.dtype == dtype && res.query.format == format && res.query.layout == layout) {
      std::vector<std::pair<std::string, std::shared_ptr<void>>> chain{{res.chosen, obj}};
      for (const auto& name : res.fallbacks) chain.emplace_back(name, registry_.find(ProviderKind::kernel, op, name)->object);
      return chain;
    }
  throw std::logic_error("KernelSet::get_chain: resolution not cached");
}

std::shared_ptr<ops::Quantizer> KernelSet::quantizer(const std::string& format) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [res, obj] : cache_)
    if (res.op == "quantize" && res.query.format == format) return std::static_pointer_cast<ops::Quantizer>(obj);
  Resolution res = resolve_quantizer(registry_, KernelQuery{device_, "", format, ""});
  if (res.chosen.empty()) {
    std::vector<std::string> why;
    for (const auto& c : res.candidates) why.push_back(str(c.backend, ": ", c.verdict));
    throw UsageError(str("model.weight_format '", format, "': no quantizer for it on ", device_.arch_name(),
                         why.empty() ? std::string(" (none registered)") : " — " + join(why, "; ")));
  }
  auto obj = registry_.find(ProviderKind::quantizer, "", res.chosen)->object;
  cache_.emplace_back(std::move(res), obj);
  return std::static_pointer_cast<ops::Quantizer>(obj);
}

std::vector<Resolution> KernelSet::resolutions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Resolution> out;
  for (const auto& [res, obj] : cache_) out.push_back(res);
  return out;
}

}  // namespace ax
