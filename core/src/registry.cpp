#include "axengine/registry.hpp"

#include <algorithm>
#include <cctype>

#include "axengine/kernel_op.hpp"
#include "axengine/op_spec.hpp"
#include "axengine/strings.hpp"

namespace ax {

const char* to_string(ProviderKind kind) {
  switch (kind) {
    case ProviderKind::kernel: return "kernel";
    case ProviderKind::model: return "model";
    case ProviderKind::dataset: return "dataset";
    case ProviderKind::optimizer: return "optimizer";
    case ProviderKind::op: return "op";
    case ProviderKind::quantizer: return "quantizer";
    case ProviderKind::executor: return "executor";
  }
  return "?";
}

std::string ProviderInfo::key() const {
  return kind == ProviderKind::kernel ? str("kernel ", op, "/", name) : str(to_string(kind), " ", name);
}

namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

// A kernel may claim only what its op defines: the conformance suite tests every claim.
void check_claims(const ProviderInfo& info, const OpSpec& spec) {
  auto within = [&](const char* axis, const std::vector<std::string>& claimed, const std::vector<std::string>& defined) {
    for (const auto& c : claimed)
      if (!contains(defined, c))
        throw UsageError(str(info.origin, ": ", info.key(), " claims ", axis, " '", c, "', which op ", spec.id,
                             " does not define (", defined.empty() ? std::string("it has none") : join(defined, ", "), ")"));
  };
  within("dtype", info.needs.dtypes, spec.dtypes);
  within("format", info.needs.formats, spec.formats);
  within("layout", info.needs.layouts, spec.layouts);
}

// An op's spec must say everything the engine asks of it.
void check_spec(const OpSpec& s, const std::string& origin) {
  const std::string where = str(origin, ": op '", s.id, "'");
  auto key_ok = !s.config_key.empty() && std::all_of(s.config_key.begin(), s.config_key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  if (!key_ok) throw UsageError(str(where, ": config key '", s.config_key, "' must be letters, digits and '_'"));
  if (s.dtypes.empty()) throw UsageError(str(where, ": defines no dtype"));
  for (const auto& d : s.dtypes) {
    if (d != "fp32" && d != "bf16" && d != "fp16")
      throw UsageError(str(where, ": dtype '", d, "' is not one of fp32, bf16, fp16"));
    (void)s.tolerance(d);  // throws naming the op and dtype
  }
  if (!s.reference) throw UsageError(str(where, ": has no reference backend"));
  if (!s.conformance) throw UsageError(str(where, ": has no conformance problem generator"));
}

}  // namespace

void Registry::add(Provider p) {
  if (p.info.name.empty()) throw UsageError(str(p.info.origin, ": a ", to_string(p.info.kind), " provider has no name"));
  if (!p.object) throw UsageError(str(p.info.origin, ": ", p.info.key(), " registered a null object"));
  if (p.info.kind == ProviderKind::op) {
    auto spec = std::static_pointer_cast<const OpSpec>(p.object);
    if (spec->id != p.info.name)
      throw UsageError(str(p.info.origin, ": ", p.info.key(), " holds the spec of op '", spec->id, "'"));
    check_spec(*spec, p.info.origin);
    for (const OpSpec* o : ops())
      if (o->id == spec->id || o->config_key == spec->config_key || o->id == spec->config_key || o->config_key == spec->id)
        throw UsageError(str(p.info.key(), " (config key '", spec->config_key, "') from ", p.info.origin,
                             " clashes with op ", o->id, " (config key '", o->config_key, "')"));
    if (const OpInfo* builtin = find_op(spec->id); builtin && p.info.plugin != "builtin")
      throw UsageError(str(p.info.key(), " from ", p.info.origin, " redefines core's op ", builtin->id));
    if (const OpInfo* builtin = find_op(spec->config_key); builtin && builtin->id != spec->id)
      throw UsageError(str(p.info.key(), " from ", p.info.origin, ": config key '", spec->config_key,
                           "' is core's op ", builtin->id));
    // The reference covers the op's whole space, on every device.
    Provider ref;
    ref.info.kind = ProviderKind::kernel;
    ref.info.op = spec->id;
    ref.info.name = "reference";
    ref.info.needs.devices = {"cpu", "cuda"};
    ref.info.needs.dtypes = spec->dtypes;
    ref.info.needs.formats = spec->formats;
    ref.info.needs.layouts = spec->layouts;
    ref.info.plugin = p.info.plugin;
    ref.info.origin = p.info.origin;
    ref.info.summary = spec->reference_summary;
    ref.object = spec->reference;
    p.info.op.clear();
    if (p.info.summary.empty()) p.info.summary = spec->summary;
    if (const Provider* old = find(ProviderKind::kernel, ref.info.op, "reference"))
      throw UsageError(str(ref.info.key(), " from ", p.info.origin, " is already provided by ", old->info.origin));
    providers_.push_back(std::move(p));
    providers_.push_back(std::move(ref));
    return;
  }
  if (p.info.kind == ProviderKind::kernel) {
    // An op registered here, or one of core's (known even in a registry without the built-ins).
    const OpSpec* spec = op(p.info.op);
    if (spec) {
      p.info.op = spec->id;
      check_claims(p.info, *spec);
    } else if (const OpInfo* builtin = find_op(p.info.op)) {
      p.info.op = builtin->id;
    } else {
      throw UsageError(str(p.info.origin, ": ", p.info.key(), ": unknown op '", p.info.op, "'"));
    }
  } else {
    p.info.op.clear();
  }
  if (const Provider* old = find(p.info.kind, p.info.op, p.info.name))
    throw UsageError(str(p.info.key(), " from ", p.info.origin, " is already provided by ", old->info.origin,
                         " (plugin ", old->info.plugin, ")"));
  providers_.push_back(std::move(p));
}

const OpSpec* Registry::op(const std::string& key) const {
  for (const auto& p : providers_)
    if (p.info.kind == ProviderKind::op) {
      auto* spec = static_cast<const OpSpec*>(p.object.get());
      if (spec->id == key || spec->config_key == key) return spec;
    }
  return nullptr;
}

std::vector<const OpSpec*> Registry::ops() const {
  std::vector<const OpSpec*> out;
  for (const auto& p : providers_)
    if (p.info.kind == ProviderKind::op) out.push_back(static_cast<const OpSpec*>(p.object.get()));
  return out;
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
