#include "axengine/registry.hpp"

#include "axengine/kernel_op.hpp"
#include "axengine/strings.hpp"

namespace ax {

const char* to_string(ProviderKind kind) {
  switch (kind) {
    case ProviderKind::kernel: return "kernel";
    case ProviderKind::model: return "model";
    case ProviderKind::dataset: return "dataset";
    case ProviderKind::optimizer: return "optimizer";
    case ProviderKind::quantizer: return "quantizer";
  }
  return "?";
}

std::string ProviderInfo::key() const {
  return kind == ProviderKind::kernel ? str("kernel ", op, "/", name) : str(to_string(kind), " ", name);
}

void Registry::add(Provider p) {
  if (p.info.name.empty()) throw UsageError(str(p.info.origin, ": a ", to_string(p.info.kind), " provider has no name"));
  if (p.info.kind == ProviderKind::kernel) {
    if (!find_op(p.info.op))
      throw UsageError(str(p.info.origin, ": ", p.info.key(), ": unknown op '", p.info.op, "'"));
    p.info.op = find_op(p.info.op)->id;
  } else {
    p.info.op.clear();
  }
  if (!p.object) throw UsageError(str(p.info.origin, ": ", p.info.key(), " registered a null object"));
  if (const Provider* old = find(p.info.kind, p.info.op, p.info.name))
    throw UsageError(str(p.info.key(), " from ", p.info.origin, " is already provided by ", old->info.origin,
                         " (plugin ", old->info.plugin, ")"));
  providers_.push_back(std::move(p));
}

const Provider* Registry::find(ProviderKind kind, const std::string& op, const std::string& name) const {
  for (const auto& p : providers_)
    if (p.info.kind == kind && p.info.name == name && (kind != ProviderKind::kernel || p.info.op == op)) return &p;
  return nullptr;
}

std::vector<const Provider*> Registry::list(ProviderKind kind, const std::string& op) const {
  std::vector<const Provider*> out;
  for (const auto& p : providers_)
    if (p.info.kind == kind && (op.empty() || p.info.op == op)) out.push_back(&p);
  return out;
}

Registry& Registry::global() {
  static Registry instance;
  return instance;
}

}  // namespace ax
