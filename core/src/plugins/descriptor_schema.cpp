#include "plugins/descriptor_schema.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::descriptor_schema {
namespace {

constexpr bool kRequired = true, kOptional = false;

bool has_type(const nlohmann::json& v, Type t) {
  auto all = [&](auto pred) { return v.is_array() && std::all_of(v.begin(), v.end(), pred); };
  switch (t) {
    case Type::string: return v.is_string();
    case Type::integer: return v.is_number_integer();
    case Type::boolean: return v.is_boolean();
    case Type::object: return v.is_object();
    case Type::string_list: return all([](const nlohmann::json& e) { return e.is_string(); });
    case Type::object_list: return all([](const nlohmann::json& e) { return e.is_object(); });
  }
  return false;
}

}  // namespace

const char* to_string(Type t) {
  switch (t) {
    case Type::string: return "a string";
    case Type::integer: return "an integer";
    case Type::boolean: return "true or false";
    case Type::object: return "an object";
    case Type::string_list: return "a list of strings";
    case Type::object_list: return "a list of objects";
  }
  return "?";
}

const std::vector<Object>& objects() {
  // The outer object and "fingerprint" are written by AXENGINE_PLUGIN_DESCRIPTOR (plugin.hpp); "plugin" and
  // below are the plugin author's JSON.
  static const std::vector<Object> schema{
      {"",
       {{"axengine_plugin", Type::integer, kRequired},
        {"abi", Type::string, kRequired},
        {"fingerprint", Type::object, kRequired},
        {"plugin", Type::object, kRequired}}},
      {"fingerprint",
       {{"torch", Type::string, kRequired},
        {"cuda", Type::string, kRequired},
        {"compiler", Type::string, kRequired},
        {"cxx11_abi", Type::string, kRequired}}},
      {"plugin",
       {{"name", Type::string, kRequired},
        {"version", Type::string, kRequired},
        {"summary", Type::string, kOptional},
        {"providers", Type::object_list, kRequired}}},
      {"plugin.providers[]",
       {{"kind", Type::string, kRequired},
        {"op", Type::string, kOptional},  // required for kernels, refused for the other kinds
        {"name", Type::string, kRequired},
        {"summary", Type::string, kOptional},
        {"requires", Type::object, kOptional},     // refused for ops (their reference covers the op's space)
        {"graph_safe", Type::boolean, kOptional}}},  // kernels only
      {"plugin.providers[].requires",
       {{"devices", Type::string_list, kOptional},
        {"arch_min", Type::string, kOptional},
        {"arch_max", Type::string, kOptional},
        {"dtypes", Type::string_list, kOptional},
        {"formats", Type::string_list, kOptional},
        {"layouts", Type::string_list, kOptional}}},
  };
  return schema;
}

const Object& object(std::string_view path) {
  for (const auto& o : objects())
    if (o.path == path) return o;
  throw std::logic_error(str("descriptor schema has no object '", path, "'"));
}

void check(const nlohmann::json& value, const Object& schema, const std::string& where) {
  const std::string name = where.empty() ? std::string("the descriptor") : where.substr(0, where.size() - 1);
  if (!value.is_object()) throw UsageError(str("plugin descriptor: '", name, "' must be an object"));
  for (auto it = value.begin(); it != value.end(); ++it) {
    auto key = std::find_if(schema.keys.begin(), schema.keys.end(), [&](const Key& k) { return k.name == it.key(); });
    if (key == schema.keys.end()) {
      std::vector<std::string> known;
      for (const auto& k : schema.keys) known.emplace_back(k.name);
      std::string guess = closest(it.key(), known);
      throw UsageError(str("plugin descriptor: unknown key '", where, it.key(), "'",
                           guess.empty() ? str(" (known keys: ", join(known, ", "), ")") : str(" (did you mean '", guess, "'?)")));
    }
    if (!has_type(it.value(), key->type))
      throw UsageError(str("plugin descriptor: '", where, it.key(), "' must be ", to_string(key->type)));
  }
  for (const auto& k : schema.keys)
    if (k.required && !value.contains(std::string(k.name))) throw UsageError(str("plugin descriptor: missing '", where, k.name, "'"));
}

}  // namespace ax::descriptor_schema
