#include "axengine/config_binder.hpp"

#include <algorithm>
#include <cmath>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "config/foreign_keys.hpp"

namespace ax {
namespace {

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "a list";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

std::string render(const std::vector<std::string>& v) {
  std::vector<std::string> q;
  for (auto& s : v) q.push_back("\"" + s + "\"");
  return "[" + join(q, ", ") + "]";
}

}  // namespace

void config_fail(const std::string& file, const toml::node* at, const std::string& message) {
  if (at && at->source().begin) {
    const auto& src = at->source();
    std::string where = src.path ? std::string(*src.path) : file;
    throw ConfigError(where, static_cast<int>(src.begin.line), static_cast<int>(src.begin.column), message);
  }
  // Parsed nodes always carry their source; one without it was put there by a --set override.
  throw ConfigError(at ? std::string("--set") : file, 0, 0, message);
}

TableBinder::TableBinder(const toml::table* table, std::string path, const BindContext& ctx)
    : table_(table), path_(std::move(path)), ctx_(ctx) {}

void TableBinder::fail(const toml::node* at, const std::string& message) const {
  config_fail(ctx_.file, at ? at : table_, message);
}

const toml::node* TableBinder::node(const char* key) {
  known_.emplace_back(key);
  return table_ ? table_->get(key) : nullptr;
}

void TableBinder::doc(const char* key, const std::string& type, const std::string& deflt, const char* text) {
  if (ctx_.docs) ctx_.docs->push_back({full(key), type, deflt, text});
}

void TableBinder::field(const char* key, bool& out, const char* text) {
  doc(key, "bool", out ? "true" : "false", text);
  if (auto* n = node(key)) {
    if (!n->is_boolean()) fail(n, str("'", full(key), "' must be true or false, not ", type_name(*n)));
    out = n->as_boolean()->get();
  }
}

void TableBinder::field(const char* key, int64_t& out, const char* text) {
  doc(key, "integer", std::to_string(out), text);
  if (auto* n = node(key)) {
    if (!n->is_integer()) fail(n, str("'", full(key), "' must be an integer, not ", type_name(*n)));
    out = n->as_integer()->get();
  }
}

void TableBinder::bounded(const char* key, int64_t& out, int64_t lo, int64_t hi, const char* text) {
  field(key, out, text);
  if (ctx_.docs) ctx_.docs->back().type = str("integer in [", lo, ", ", hi, "]");
  if (out < lo || out > hi) fail(table_ ? table_->get(key) : nullptr, str("'", full(key), "' is ", out, ", must be in [", lo, ", ", hi, "]"));
}

void TableBinder::field(const char* key, double& out, const char* text) {
  doc(key, "float", str(out), text);
  if (auto* n = node(key)) {
    if (n->is_floating_point()) out = n->as_floating_point()->get();
    else if (n->is_integer()) out = static_cast<double>(n->as_integer()->get());
    else fail(n, str("'", full(key), "' must be a number, not ", type_name(*n)));
    // TOML allows nan and inf; no key means them (a range check like `x < 0` lets nan through), so every
    // float key refuses them here, once.
    if (!std::isfinite(out)) fail(n, str("'", full(key), "' is ", out, ", must be a finite number"));
  }
}

void TableBinder::positive(const char* key, double& out, const char* text) {
  field(key, out, text);
  if (!(out > 0)) fail(table_ ? table_->get(key) : nullptr, str("'", full(key), "' must be > 0"));
}

void TableBinder::field(const char* key, std::string& out, const char* text) {
  doc(key, "string", out.empty() ? "" : "\"" + out + "\"", text);
  if (auto* n = node(key)) {
    if (!n->is_string()) fail(n, str("'", full(key), "' must be a string, not ", type_name(*n)));
    out = n->as_string()->get();
  }
}

void TableBinder::field(const char* key, std::vector<std::string>& out, const char* text) {
  doc(key, "list of strings", render(out), text);
  if (auto* n = node(key)) {
    const toml::array* a = n->as_array();
    if (!a) fail(n, str("'", full(key), "' must be a list of strings, not ", type_name(*n)));
    out.clear();
    for (const auto& e : *a) {
      if (!e.is_string()) fail(&e, str("'", full(key), "' must be a list of strings; found ", type_name(e)));
      out.push_back(e.as_string()->get());
    }
  }
}

void TableBinder::choice(const char* key, std::string& out, const std::vector<std::string>& allowed, const char* text) {
  field(key, out, text);
  if (ctx_.docs) ctx_.docs->back().type = "one of " + join(allowed, ", ");
  if (std::find(allowed.begin(), allowed.end(), out) == allowed.end()) {
    std::string hint = closest(out, allowed);
    fail(table_ ? table_->get(key) : nullptr, str("'", full(key), "' is \"", out, "\", expected one of ", join(allowed, ", "),
                                                hint.empty() ? "" : str(" (did you mean \"", hint, "\"?)")));
  }
}

TableBinder TableBinder::sub(const char* key, const char* text) {
  doc(key, "table", "", text);
  const toml::node* n = node(key);
  if (n && !n->is_table()) {
    // `optimizer = "adamw_torch"` at the top level is axolotl's key, not our [optimizer] table written wrong.
    const std::string hint = foreign_key_hint(path_, key);
    fail(n, str("'", full(key), "' must be a table, not ", type_name(*n), hint.empty() ? "" : " (" + hint + ")"));
  }
  return TableBinder(n ? n->as_table() : nullptr, full(key), ctx_);
}

void TableBinder::accept(const std::string& key) { known_.push_back(key); }

void TableBinder::finish() const {
  if (!table_) return;
  for (const auto& [k, v] : *table_) {
    std::string key(k.str());
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    std::string msg = str("unknown key '", full(key), "'");
    // Another tool's name for one of our keys (axolotl's learning_rate) says which; else the closest known key.
    if (const std::string foreign = foreign_key_hint(path_, key); !foreign.empty()) msg += " (" + foreign + ")";
    else if (const std::string hint = closest(key, known_); !hint.empty()) msg += str(" (did you mean '", full(hint), "'?)");
    const toml::node* at = &v;
    if (k.source().begin) {
      const auto& src = k.source();
      throw ConfigError(src.path ? std::string(*src.path) : ctx_.file, static_cast<int>(src.begin.line),
                        static_cast<int>(src.begin.column), msg);
    }
    fail(at, msg);
  }
}

}  // namespace ax
