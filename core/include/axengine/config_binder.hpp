// Binds a TOML table to typed fields, strictly: wrong types and unknown keys are ConfigErrors with
// file:line:column and, for unknown keys, the closest known key. The same binding code also documents
// the schema (key, type, default, meaning), which is how docs/config.md is generated and kept honest.
//
//   TableBinder t(table, "train", ctx);
//   t.field("lr", cfg.lr, "peak learning rate");
//   t.choice("schedule", cfg.schedule, {"constant", "linear", "cosine"}, "learning-rate schedule");
//   t.finish();                        // unknown keys -> error
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace ax {

struct ConfigKeyDoc {
  std::string key;    // dotted path: "train.lr", "datasets[].path"
  std::string type;   // "string", "integer", "float", "bool", "list of strings", "table", "one of a|b"
  std::string deflt;  // rendered default, "" when none
  std::string doc;
};

struct BindContext {
  std::string file;                    // config file, for error locations
  std::vector<ConfigKeyDoc>* docs = nullptr;  // when set: record the schema as fields are bound
};

class TableBinder {
 public:
  // `table` may be null (section absent: every field keeps its default).
  TableBinder(const toml::table* table, std::string path, const BindContext& ctx);

  void field(const char* key, bool& out, const char* doc);
  void field(const char* key, int64_t& out, const char* doc);
  void field(const char* key, double& out, const char* doc);  // integers accepted
  void field(const char* key, std::string& out, const char* doc);
  void field(const char* key, std::vector<std::string>& out, const char* doc);
  void choice(const char* key, std::string& out, const std::vector<std::string>& allowed, const char* doc);
  // Integer with inclusive bounds.
  void bounded(const char* key, int64_t& out, int64_t lo, int64_t hi, const char* doc);
  void positive(const char* key, double& out, const char* doc);  // > 0

  // A nested table; absent -> null table (defaults). Documented as a section.
  TableBinder sub(const char* key, const char* doc);
  // Keys handled by the caller (e.g. dynamic op names): marks them known.
  void accept(const std::string& key);

  const toml::table* table() const { return table_; }
  const std::string& path() const { return path_; }
  const BindContext& context() const { return ctx_; }
  [[noreturn]] void fail(const toml::node* at, const std::string& message) const;

  // Throws for the first key not bound/accepted, suggesting the closest known one.
  void finish() const;

 private:
  const toml::node* node(const char* key);
  void doc(const char* key, const std::string& type, const std::string& deflt, const char* text);
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const toml::table* table_;
  std::string path_;
  BindContext ctx_;
  std::vector<std::string> known_;
};

// The location of `node` as a ConfigError, for checks done outside a binder.
[[noreturn]] void config_fail(const std::string& file, const toml::node* at, const std::string& message);

// A config table a plugin owns (PluginRegistrar::backend_options / config_table in plugin.hpp): bound with
// the rest of the config, its keys held to the same rules (types, locations, unknown keys refused with the
// closest known one). `bind` binds every key the plugin accepts and, unless the binder is documenting the
// schema (context().docs set, null table), hands the bound options to the plugin.
struct PluginConfigTable {
  std::string path;    // "kernels.options.<backend>" (a backend's options) or "<plugin name>" (top level)
  std::string doc;
  std::function<void(TableBinder& table)> bind;
  std::string plugin;  // the plugin that declared it (set by the loader)
};

}  // namespace ax
