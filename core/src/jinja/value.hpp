#pragma once
// Values of the Jinja evaluator, with Python's semantics where a chat template can see them: str() and repr()
// of None/True/floats/lists/dicts, truthiness, json.dumps (transformers' tojson), Unicode-aware string
// operations (length, slicing and strip count code points, as Python's str does).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/jinja.hpp"
#include "tokenizer/unicode.hpp"

namespace ax::jinja::detail {

// UTF-8 helpers. Input strings are valid UTF-8 (JSON parsers and the lexer guarantee it); decoding stays
// defensive anyway and maps a stray byte to U+FFFD.
inline void append_utf8(std::string& out, std::uint32_t cp) { tok::append_utf8(out, static_cast<char32_t>(cp)); }
std::vector<std::uint32_t> decode_utf8(std::string_view s);
std::string encode_utf8(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end);
std::size_t utf8_length(std::string_view s);
bool py_isspace(std::uint32_t cp);
// Bytes of leading / trailing Python whitespace.
std::size_t py_whitespace_prefix(std::string_view s);
std::size_t py_whitespace_suffix(std::string_view s);

class Value;
struct Namespace;
struct Args;
using Function = std::function<Value(Args&)>;

// A Jinja value: undefined, JSON data (shared and immutable: a member read aliases its parent, no copy), a
// namespace() object (mutable, shared), or a callable (macro, global function, bound method).
class Value {
 public:
  enum class Kind { undefined, data, ns, callable };

  Value() = default;  // undefined
  static Value undefined(std::string name) {
    Value v;
    v.name_ = std::move(name);
    return v;
  }
  Value(Json j) : kind_(Kind::data), data_(std::make_shared<const Json>(std::move(j))) {}
  Value(std::shared_ptr<const Json> j) : kind_(Kind::data), data_(std::move(j)) {}
  Value(std::shared_ptr<Namespace> ns) : kind_(Kind::ns), ns_(std::move(ns)) {}
  static Value callable(std::string name, Function fn) {
    Value v;
    v.kind_ = Kind::callable;
    v.fn_ = std::make_shared<Function>(std::move(fn));
    v.name_ = std::move(name);
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_data() const { return kind_ == Kind::data; }
  const Json& json() const { return *data_; }
  const std::shared_ptr<const Json>& json_ptr() const { return data_; }
  const std::shared_ptr<Namespace>& ns() const { return ns_; }
  const Function& fn() const { return *fn_; }
  const std::string& name() const { return name_; }  // undefined: what was looked up; callable: its name

  bool is_string() const { return is_data() && data_->is_string(); }
  bool is_none() const { return is_data() && data_->is_null(); }
  const std::string& str() const { return data_->get_ref<const std::string&>(); }

  // A member of this value's JSON, sharing its storage.
  Value alias(const Json& member) const { return Value(std::shared_ptr<const Json>(data_, &member)); }

  // This value as JSON, for storing in a list or dict; namespaces become objects, callables and undefined fail.
  Json to_json() const;

 private:
  Kind kind_ = Kind::undefined;
  std::shared_ptr<const Json> data_;
  std::shared_ptr<Namespace> ns_;
  std::shared_ptr<Function> fn_;
  std::string name_;
};

struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(const std::string& key) {
    for (auto& [k, v] : attrs)
      if (k == key) return &v;
    return nullptr;
  }
};

bool truthy(const Value& v);
// Python's str(v) (undefined renders as ""), repr(v), and the type name used in error messages.
std::string py_str(const Value& v);
std::string py_repr(const Json& j);
std::string py_float_repr(double d);
std::string type_name(const Value& v);

// json.dumps(j, ensure_ascii=..., indent=..., separators=..., sort_keys=...) byte for byte. indent < 0: None.
struct DumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent given
  bool sort_keys = false;
};
std::string py_json_dumps(const Json& j, const DumpOptions& opt);

}  // namespace ax::jinja::detail
