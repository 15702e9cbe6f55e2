#include "axengine/descriptor.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <nlohmann/json.hpp>

#include "axengine/kernel_op.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/ops/moe_experts.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/ops/quant_formats.hpp"
#include "axengine/plugin.hpp"
#include "axengine/strings.hpp"
#include "plugins/descriptor_schema.hpp"

namespace ax {
namespace {

using nlohmann::json;
namespace schema = descriptor_schema;

// The value sets. Names in messages come with the closest valid one when there is a plausible typo.
UsageError bad_value(const std::string& key, const std::string& value, const std::vector<std::string>& allowed) {
  std::string guess = closest(value, allowed);
  return UsageError(str("plugin descriptor: '", key, "' has '", value, "', expected ",
                        allowed.empty() ? std::string("none") : "one of " + join(allowed, ", "),
                        guess.empty() ? "" : str(" (did you mean '", guess, "'?)")));
}

std::vector<std::string> string_list(const json& obj, const char* key, const std::string& where,
                                     const std::vector<std::string>& allowed) {
  std::vector<std::string> out;
  if (auto it = obj.find(key); it != obj.end())
    for (const auto& v : *it) {
      out.push_back(v.get<std::string>());
      if (std::find(allowed.begin(), allowed.end(), out.back()) == allowed.end())
        throw bad_value(where + key, out.back(), allowed);
    }
  return out;
}

int arch_field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return 0;
  const std::string text = it->get<std::string>();
  if (text.rfind("sm_", 0) == 0)
    if (auto a = parse_arch(text)) return *a;
  throw UsageError(str("plugin descriptor: '", where, key, "' is '", text, "', expected an arch like \"sm_90\""));
}

// Plugin and provider names appear in the run config and in messages: no spaces, quotes or separators.
std::string name_field(const json& obj, const std::string& where) {
  std::string name = obj.at("name").get<std::string>();
  const bool ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
  if (!ok) throw UsageError(str("plugin descriptor: '", where, "name' is '", name, "', expected letters, digits, '_', '-' or '.'"));
  return name;
}

ProviderKind parse_kind(const std::string& k, const std::string& where) {
  std::vector<std::string> names;
  for (auto kind : {ProviderKind::kernel, ProviderKind::model, ProviderKind::dataset, ProviderKind::optimizer,
                    ProviderKind::op, ProviderKind::quantizer, ProviderKind::executor}) {
    if (k == to_string(kind)) return kind;
    names.push_back(to_string(kind));
  }
  throw bad_value(where + "kind", k, names);
}

// "MAJOR.MINOR", both plain non-negative integers.
void parse_abi(const std::string& abi, PluginDescriptor& d) {
  const char* end = abi.data() + abi.size();
  auto [p1, e1] = std::from_chars(abi.data(), end, d.abi_major);
  bool ok = e1 == std::errc() && p1 != abi.data() && p1 < end && *p1 == '.' && p1 + 1 < end;
  if (ok) {
    auto [p2, e2] = std::from_chars(p1 + 1, end, d.abi_minor);
    ok = e2 == std::errc() && p2 == end && d.abi_major >= 0 && d.abi_minor >= 0;
  }
  if (!ok) throw UsageError(str("plugin descriptor: 'abi' is '", abi, "', expected MAJOR.MINOR"));
}

// Layout names exist per op (of core's: moe.experts and moe.mlp, whose weights are laid out alike, and
// attention). An op the plugin defines itself says its layouts in its OpSpec, which the registry checks the
// claims against once it is registered: nullopt.
std::optional<std::vector<std::string>> layouts_of(const std::string& op) {
  if (op == ops::MoeExperts::kOp || op == ops::MoeMlp::kOp) return std::vector<std::string>{to_string(ops::ExpertLayout::EKN), to_string(ops::ExpertLayout::ENK)};
  if (op == ops::Attention::kOp) return std::vector<std::string>{"plain", "sinks"};  // its OpSpec's (ops/reference)
  if (find_op(op)) return std::vector<std::string>{};
  return std::nullopt;
}

std::vector<std::string> format_names() {
  std::vector<std::string> out;
  for (auto f : {ops::WeightFormat::dense, ops::WeightFormat::nf4, ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4,
                 ops::WeightFormat::fp8})
    out.push_back(to_string(f));
  return out;
}

Requirements parse_requires(const json& r, const std::string& where, const PluginDescriptor::Declared& decl) {
  schema::check(r, schema::object("plugin.providers[].requires"), where);
  Requirements needs;
  needs.devices = string_list(r, "devices", where, {"cpu", "cuda"});
  needs.arch_min = arch_field(r, "arch_min", where);
  needs.arch_max = arch_field(r, "arch_max", where);
  if (needs.arch_min && needs.arch_max && needs.arch_min > needs.arch_max)
    throw UsageError(str("plugin descriptor: '", where, "arch_min' (", arch_name(needs.arch_min), ") is above '", where,
                         "arch_max' (", arch_name(needs.arch_max), ")"));
  needs.dtypes = string_list(r, "dtypes", where, {"fp32", "bf16", "fp16"});
  needs.formats = string_list(r, "formats", where, format_names());
  if (auto layouts = layouts_of(decl.op)) {
    needs.layouts = string_list(r, "layouts", where, *layouts);
  } else if (auto it = r.find("layouts"); it != r.end()) {
    for (const auto& v : *it) needs.layouts.push_back(v.get<std::string>());
  }
  return needs;
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
  if (doc.is_discarded()) throw UsageError("plugin descriptor: not valid JSON");
  if (!doc.is_object()) throw UsageError("plugin descriptor: not a JSON object");
  schema::check(doc, schema::object(""), "");
  if (doc["axengine_plugin"] != 1)
    throw UsageError(str("plugin descriptor: 'axengine_plugin' is ", doc["axengine_plugin"].dump(), ", expected 1"));
  PluginDescriptor d;
  parse_abi(doc["abi"].get<std::string>(), d);
  const json& fp = doc["fingerprint"];
  schema::check(fp, schema::object("fingerprint"), "fingerprint.");
  d.fingerprint = {fp["torch"].get<std::string>(), fp["cuda"].get<std::string>(), fp["compiler"].get<std::string>(),
                   fp["cxx11_abi"].get<std::string>()};
  const json& p = doc["plugin"];
  schema::check(p, schema::object("plugin"), "plugin.");
  d.name = name_field(p, "plugin.");
  d.version = p["version"].get<std::string>();
  if (d.version.empty()) throw UsageError("plugin descriptor: 'plugin.version' is empty");
  const json& providers = p["providers"];
  // Ops the plugin defines itself ({"kind": "op"}): its kernels may name them as well as core's ops.
  std::vector<std::string> own_ops;
  for (const auto& e : providers)
    if (e.is_object() && e.value("kind", json()) == "op" && e.contains("name") && e["name"].is_string())
      own_ops.push_back(e["name"].get<std::string>());
  for (std::size_t i = 0; i < providers.size(); ++i) {
    const json& e = providers[i];
    const std::string where = str("plugin.providers[", i, "].");
    schema::check(e, schema::object("plugin.providers[]"), where);
    PluginDescriptor::Declared decl;
    decl.kind = parse_kind(e["kind"].get<std::string>(), where);
    decl.name = name_field(e, where);
    if (decl.kind == ProviderKind::kernel) {
      if (!e.contains("op")) throw UsageError(str("plugin descriptor: missing '", where, "op' (kernel providers name their op)"));
      decl.op = e["op"].get<std::string>();
      const OpInfo* op = find_op(decl.op);
      if (op) {
        decl.op = op->id;
      } else if (std::find(own_ops.begin(), own_ops.end(), decl.op) == own_ops.end()) {
        std::vector<std::string> ids;
        for (const auto& o : known_ops()) ids.push_back(o.id);
        ids.insert(ids.end(), own_ops.begin(), own_ops.end());
        throw bad_value(where + "op", decl.op, ids);
      }
      if (e.contains("graph_safe")) decl.graph_safe = e["graph_safe"].get<bool>();
    } else if (e.contains("op")) {
      throw UsageError(str("plugin descriptor: '", where, "op' is for kernel providers only (this one is a ",
                           to_string(decl.kind), ")"));
    }
    if (decl.kind != ProviderKind::kernel && e.contains("graph_safe"))
      throw UsageError(str("plugin descriptor: '", where, "graph_safe' is for kernel providers only (this one is a ",
                           to_string(decl.kind), ")"));
    if (decl.kind == ProviderKind::op && e.contains("requires"))
      throw UsageError(str("plugin descriptor: '", where, "requires' is for backends; op ", decl.name,
                           "'s reference covers the space its OpSpec defines"));
    if (decl.kind == ProviderKind::op && find_op(decl.name))
      throw UsageError(str("plugin descriptor: '", where, "name' is '", decl.name, "', one of core's ops"));
    if (e.contains("summary")) decl.summary = e["summary"].get<std::string>();
    if (e.contains("requires")) decl.needs = parse_requires(e["requires"], where + "requires.", decl);
    d.providers.push_back(std::move(decl));
  }
  return d;
}

}  // namespace ax
