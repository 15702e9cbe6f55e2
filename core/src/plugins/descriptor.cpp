#include "axengine/descriptor.hpp"

#include <nlohmann/json.hpp>

#include "axengine/kernel_op.hpp"
#include "axengine/plugin.hpp"
#include "axengine/strings.hpp"

namespace ax {
namespace {

using nlohmann::json;

const json& field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) throw UsageError(str("plugin descriptor: missing '", where, key, "'"));
  return *it;
}

std::string string_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_string()) throw UsageError(str("plugin descriptor: '", where, key, "' must be a string"));
  return v.get<std::string>();
}

std::vector<std::string> string_list(const json& obj, const char* key, const std::string& where,
                                     const std::vector<std::string>& allowed = {}) {
  auto it = obj.find(key);
  if (it == obj.end()) return {};
  if (!it->is_array()) throw UsageError(str("plugin descriptor: '", where, key, "' must be a list of strings"));
  std::vector<std::string> out;
  for (const auto& v : *it) {
    if (!v.is_string()) throw UsageError(str("plugin descriptor: '", where, key, "' must be a list of strings"));
    out.push_back(v.get<std::string>());
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), out.back()) == allowed.end())
      throw UsageError(str("plugin descriptor: '", where, key, "' has '", out.back(), "', expected one of ", join(allowed, ", ")));
  }
  return out;
}

int arch_field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return 0;
  if (it->is_string())
    if (auto a = parse_arch(it->get<std::string>())) return *a;
  throw UsageError(str("plugin descriptor: '", where, key, "' must be an arch like \"sm_90\""));
}

ProviderKind parse_kind(const std::string& k, const std::string& where) {
  for (auto kind : {ProviderKind::kernel, ProviderKind::model, ProviderKind::dataset, ProviderKind::optimizer})
    if (k == to_string(kind)) return kind;
  throw UsageError(str("plugin descriptor: '", where, "kind' is '", k, "', expected kernel, model, dataset or optimizer"));
}

}  // namespace

std::optional<std::string> BuildFingerprint::mismatch(const BuildFingerprint& host) const {
  auto differs = [](const char* what, const std::string& mine, const std::string& theirs) {
    return str(what, " ", mine, " (host: ", what, " ", theirs, ")");
  };
  if (torch != host.torch) return differs("torch", torch, host.torch);
  // A CPU-only plugin runs with any LibTorch of the same version; a CUDA one needs the same CUDA major.
  if (cuda != host.cuda && cuda != "none") {
    if (cuda.substr(0, cuda.find('.')) != host.cuda.substr(0, host.cuda.find('.'))) return differs("cuda", cuda, host.cuda);
  }
  if (compiler != host.compiler) return differs("compiler", compiler, host.compiler);
  if (cxx11_abi != host.cxx11_abi) return differs("cxx11 abi", cxx11_abi, host.cxx11_abi);
  return std::nullopt;
}

std::string BuildFingerprint::describe() const {
  return str("torch ", torch, ", cuda ", cuda, ", ", compiler, ", cxx11 abi ", cxx11_abi);
}

const BuildFingerprint& host_fingerprint() {
  static const BuildFingerprint fp{AXENGINE_DESCRIPTOR_TORCH, AXENGINE_TORCH_CUDA, AXENGINE_DESCRIPTOR_COMPILER,
                                   AXENGINE_DESCRIPTOR_CXX11_ABI};
  return fp;
}

PluginDescriptor parse_descriptor(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) throw UsageError("plugin descriptor: not valid JSON");
  PluginDescriptor d;
  std::string abi = string_field(doc, "abi", "");
  if (std::sscanf(abi.c_str(), "%d.%d", &d.abi_major, &d.abi_minor) != 2)
    throw UsageError(str("plugin descriptor: 'abi' is '", abi, "', expected MAJOR.MINOR"));
  const json& fp = field(doc, "fingerprint", "");
  d.fingerprint = {string_field(fp, "torch", "fingerprint."), string_field(fp, "cuda", "fingerprint."),
                   string_field(fp, "compiler", "fingerprint."), string_field(fp, "cxx11_abi", "fingerprint.")};
  const json& p = field(doc, "plugin", "");
  if (!p.is_object()) throw UsageError("plugin descriptor: 'plugin' must be an object");
  d.name = string_field(p, "name", "plugin.");
  d.version = string_field(p, "version", "plugin.");
  const json& providers = field(p, "providers", "plugin.");
  if (!providers.is_array()) throw UsageError("plugin descriptor: 'plugin.providers' must be a list");
  for (std::size_t i = 0; i < providers.size(); ++i) {
    const json& e = providers[i];
    std::string where = str("plugin.providers[", i, "].");
    if (!e.is_object()) throw UsageError(str("plugin descriptor: '", where, "' must be an object"));
    PluginDescriptor::Declared decl;
    decl.kind = parse_kind(string_field(e, "kind", where), where);
    decl.name = string_field(e, "name", where);
    if (decl.kind == ProviderKind::kernel) {
      decl.op = string_field(e, "op", where);
      const OpInfo* op = find_op(decl.op);
      if (!op) throw UsageError(str("plugin descriptor: '", where, "op' names unknown op '", decl.op, "'"));
      decl.op = op->id;
    }
    if (auto s = e.find("summary"); s != e.end() && s->is_string()) decl.summary = s->get<std::string>();
    if (auto r = e.find("requires"); r != e.end()) {
      if (!r->is_object()) throw UsageError(str("plugin descriptor: '", where, "requires' must be an object"));
      std::string rw = where + "requires.";
      decl.needs.devices = string_list(*r, "devices", rw, {"cpu", "cuda"});
      decl.needs.arch_min = arch_field(*r, "arch_min", rw);
      decl.needs.arch_max = arch_field(*r, "arch_max", rw);
      decl.needs.dtypes = string_list(*r, "dtypes", rw, {"fp32", "bf16", "fp16"});
      decl.needs.formats = string_list(*r, "formats", rw);
      decl.needs.layouts = string_list(*r, "layouts", rw);
    }
    d.providers.push_back(std::move(decl));
  }
  return d;
}

}  // namespace ax
