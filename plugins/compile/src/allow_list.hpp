// The [compile] table's allow-list: ONE table of (key, type, default, doc, setter) that is the only source of
// the table's validation (types, bounds, unknown keys), its documentation (docs/config.md is generated from
// the binding) and its runtime apply (each key's setter, setters.cpp). A key without a setter, or a setter
// without a key, is refused when the plugin registers and by a test (the rename sentinel).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <axengine/config_binder.hpp>

namespace ax::compile {

using Value = std::variant<bool, int64_t, std::string>;
enum class KeyType { boolean, integer, string };

struct AllowedKey {
  const char* key;
  KeyType type;
  Value deflt;
  int64_t lo = 0, hi = 0;  // integers: inclusive bounds
  bool per_arch = true;    // may be overridden in [compile.arch.sm_XX]
  const char* doc;         // what it does, what it costs, where it was measured to help or hurt
};

// The allow-list, in documentation order. "enabled" is first.
const std::vector<AllowedKey>& allow_list();

// The bound table: every key's value (its default when absent), and the per-arch overrides.
struct CompileOptions {
  std::map<std::string, Value> values;
  std::map<int, std::map<std::string, Value>> by_arch;  // arch (90 for sm_90) -> key -> value
  std::vector<std::string> given;                      // keys present in [compile], for "set while disabled"
  std::string config_dir;                              // for relative paths (cache_dir)

  bool enabled() const;
  // The values for a device arch (0: not a GPU): the base values with that arch's overrides applied.
  std::map<std::string, Value> resolve(int arch) const;
};

// Binds [compile] (TableBinder: file:line:col errors, "did you mean" and the allowed list for unknown keys).
// Refuses keys set while enabled = false, an arch table not named sm_<digits>, and conflicting values.
void bind_compile(TableBinder& table, CompileOptions& options);

// The values' conflicts (deterministic with cudnn_benchmark, static_shapes without cuda_graphs...), "" when
// none: checked for the base values and for every arch's, with the arch named.
std::string conflicts(const std::map<std::string, Value>& values);

}  // namespace ax::compile
