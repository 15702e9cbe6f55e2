// The plugin descriptor's written schema: every object of the descriptor, the keys it may hold, each key's
// JSON type and whether it is required. parse_descriptor checks a descriptor against it before reading any
// value, so a misspelled optional key ("require") refuses the plugin instead of being ignored (which would
// widen the provider's claim to every device, dtype and format). Value sets — device, dtype, format and
// layout names, arch strings, op ids — are checked where the values are read (descriptor.cpp).
// docs/plugins.md documents the same keys; a test keeps the two in step. Adding an optional key is a plugin
// ABI minor bump, anything else a major one (version.hpp).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ax::descriptor_schema {

enum class Type { string, integer, boolean, object, string_list, object_list };
const char* to_string(Type type);

struct Key {
  std::string_view name;
  Type type;
  bool required;
};

struct Object {
  std::string_view path;  // "" (the whole descriptor), "fingerprint", "plugin", "plugin.providers[]", ...
  std::vector<Key> keys;
};

// Every object of the schema, outermost first.
const std::vector<Object>& objects();
// The object at `path` (one of objects()).
const Object& object(std::string_view path);

// Checks `value` against `schema`: a JSON object, no key outside the schema (the message suggests the closest
// known key), every required key present, every key of its type. `where` prefixes key names in messages
// ("plugin.providers[0]."). Throws UsageError naming the key.
void check(const nlohmann::json& value, const Object& schema, const std::string& where);

}  // namespace ax::descriptor_schema
