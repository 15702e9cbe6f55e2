// Filters, tests, methods and global functions of the Jinja subset (docs/jinja.md), each with the behaviour of
// Jinja2 3.1 / Python 3 that chat templates rely on. An unknown name is an error, never a silent no-op.
#include <algorithm>
#include <chrono>
#include <cmath>

#include <utf8proc.h>

#include "jinja/eval.hpp"

namespace ax::jinja::detail {
namespace {

[[noreturn]] void fail(std::string msg) { throw EvalFail{std::move(msg)}; }

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + " needs a string, got '" + type_name(v) + "'");
  return v.str();
}
std::int64_t need_int(const Value& v, const char* what) {
  if (!v.is_data() || !(v.json().is_number_integer() || v.json().is_boolean()))
    fail(std::string(what) + " needs an integer, got '" + type_name(v) + "'");
  return v.json().is_boolean() ? v.json().get<bool>() : v.json().get<std::int64_t>();
}

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  for (std::uint32_t c : decode_utf8(s)) {
    auto m = upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) : utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
    append_utf8(out, static_cast<std::uint32_t>(m));
  }
  return out;
}
bool is_alpha_cp(std::uint32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
std::string capitalize(const std::string& s) {
  auto cps = decode_utf8(s);
  std::string out;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    auto c = static_cast<utf8proc_int32_t>(cps[i]);
    append_utf8(out, static_cast<std::uint32_t>(i == 0 ? utf8proc_toupper(c) : utf8proc_tolower(c)));
  }
  return out;
}
std::string title(const std::string& s) {
  std::string out;
  bool prev_alpha = false;
  for (std::uint32_t c : decode_utf8(s)) {
    auto ci = static_cast<utf8proc_int32_t>(c);
    append_utf8(out, static_cast<std::uint32_t>(prev_alpha ? utf8proc_tolower(ci) : utf8proc_toupper(ci)));
    prev_alpha = is_alpha_cp(c);
  }
  return out;
}

// str.strip/lstrip/rstrip: Python whitespace, or any of `chars`.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto cps = decode_utf8(s);
  std::vector<std::uint32_t> set;
  bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) set = decode_utf8(need_str(chars, "strip"));
  auto drop = [&](std::uint32_t c) { return ws ? py_isspace(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  return encode_utf8(cps, b, e);
}

Json split(const std::string& s, const Value& sep, std::int64_t maxsplit) {
  Json out = Json::array();
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace, no empty pieces
    auto cps = decode_utf8(s);
    std::size_t i = 0;
    while (true) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
        std::size_t e = cps.size();
        while (e > i && py_isspace(cps[e - 1])) --e;
        out.push_back(encode_utf8(cps, i, e));
        break;
      }
      std::size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      out.push_back(encode_utf8(cps, i, j));
      i = j;
    }
    return out;
  }
  const std::string& d = need_str(sep, "split");
  if (d.empty()) fail("empty separator");
  std::size_t pos = 0;
  while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
    std::size_t k = s.find(d, pos);
    if (k == std::string::npos) break;
    out.push_back(s.substr(pos, k - pos));
    pos = k + d.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character and at both ends
    auto cps = decode_utf8(s);
    std::int64_t n = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  std::size_t pos = 0;
  std::int64_t n = 0;
  while (count < 0 || n < count) {
    std::size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out += to;
    pos = k + from.size();
    ++n;
  }
  out.append(s, pos);
  return out;
}

bool starts_or_ends(const std::string& s, const Value& arg, bool starts) {
  auto one = [&](const std::string& p) {
    return p.size() <= s.size() && (starts ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
  };
  if (arg.is_data() && arg.json().is_array()) {
    for (const auto& p : arg.json()) {
      if (!p.is_string()) fail("startswith/endswith tuple items must be strings");
      if (one(p.get_ref<const std::string&>())) return true;
    }
    return false;
  }
  return one(need_str(arg, starts ? "startswith" : "endswith"));
}

Json to_json_arg(const Value& v, const char* what) {
  if (v.is_undefined()) fail(std::string(what) + ": Object of type Undefined is not JSON serializable");
  return v.to_json();
}

// A dotted attribute path ("a.b" or "0") applied as Jinja's make_attrgetter does.
Value attr_path(const Value& item, const std::string& path) {
  Value cur = item;
  std::size_t pos = 0;
  while (true) {
    std::size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits && part.size() < 18 ? getitem(cur, Value(Json(std::stoll(part)))) : getitem(cur, Value(Json(part)));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

Value select(const Value& v, Args& args, bool by_attr, bool reject) {
  // selectattr(attr, test, args...) / select(test, args...), and their reject twins.
  std::size_t k = 0;
  std::string attr;
  if (by_attr) attr = need_str(args.get(k++, "attribute"), "selectattr");
  Json out = Json::array();
  for (const Value& item : iterate(v)) {
    Value x = by_attr ? attr_path(item, attr) : item;
    bool ok;
    if (args.pos.size() <= k) {
      ok = truthy(x);
    } else {
      Args targs;
      targs.renderer = args.renderer;
      targs.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(k) + 1, args.pos.end());
      ok = apply_test(need_str(args.pos[k], "select test name"), x, targs);
    }
    if (ok != reject) out.push_back(item.to_json());
  }
  return Value(std::move(out));
}

Value html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(Json(std::move(out)));
}

bool is_number(const Value& v) { return v.is_data() && (v.json().is_number() || v.json().is_boolean()); }
double as_double(const Value& v) { return v.json().is_boolean() ? v.json().get<bool>() : v.json().get<double>(); }

}  // namespace

Value Args::get(std::size_t i, const char* name, Value fallback) const {
  if (i < pos.size()) return pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return fallback;
}
bool Args::has(std::size_t i, const char* name) const {
  if (i < pos.size()) return true;
  for (const auto& [k, v] : kw)
    if (k == name) return true;
  return false;
}
void Args::check(const char* what, std::size_t max_pos, std::initializer_list<const char*> allowed) const {
  if (pos.size() > max_pos)
    fail(std::string(what) + " takes at most " + std::to_string(max_pos) + " positional arguments, got " + std::to_string(pos.size()));
  for (const auto& [k, v] : kw) {
    bool ok = false;
    for (const char* a : allowed) ok |= k == a;
    if (!ok) fail(std::string(what) + " got an unexpected keyword argument '" + k + "'");
  }
}

std::string value_str(const Value& v) { return py_str(v); }

static bool json_equal(const Json& a, const Json& b) {
  auto num = [](const Json& j) { return j.is_number() || j.is_boolean(); };
  if (num(a) && num(b)) {
    if (!a.is_number_float() && !b.is_number_float()) {
      auto i = [](const Json& j) -> std::int64_t { return j.is_boolean() ? j.get<bool>() : j.get<std::int64_t>(); };
      return i(a) == i(b);
    }
    auto d = [](const Json& j) -> double { return j.is_boolean() ? j.get<bool>() : j.get<double>(); };
    return d(a) == d(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {  // Python dicts compare regardless of key order
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      auto it = b.find(k);
      if (it == b.end() || !json_equal(v, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined: return true;
    case Value::Kind::ns: return a.ns() == b.ns();
    case Value::Kind::callable: return &a.fn() == &b.fn();
    case Value::Kind::data: return json_equal(a.json(), b.json());
  }
  return false;
}

int py_compare(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) {
    const Json &x = a.json(), &y = b.json();
    if (!x.is_number_float() && !y.is_number_float()) {
      auto i = [](const Json& j) -> std::int64_t { return j.is_boolean() ? j.get<bool>() : j.get<std::int64_t>(); };
      return i(x) < i(y) ? -1 : i(x) > i(y) ? 1 : 0;
    }
    double p = as_double(a), q = as_double(b);
    return p < q ? -1 : p > q ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_data() && b.is_data() && a.json().is_array() && b.json().is_array()) {
    const Json &x = a.json(), &y = b.json();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (json_equal(x[i], y[i])) continue;
      return py_compare(a.alias(x[i]), b.alias(y[i]));
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("comparison not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool py_contains(const Value& c, const Value& item) {
  if (c.is_undefined()) return false;
  if (!c.is_data()) fail("argument of type '" + type_name(c) + "' is not iterable");
  const Json& j = c.json();
  if (j.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
    return j.get_ref<const std::string&>().find(item.str()) != std::string::npos;
  }
  if (j.is_array()) {
    for (const auto& x : j)
      if (item.is_data() && json_equal(x, item.json())) return true;
    return false;
  }
  if (j.is_object()) return item.is_string() && j.contains(item.str());
  fail("argument of type '" + type_name(c) + "' is not iterable");
}

std::vector<Value> iterate(const Value& v) {
  std::vector<Value> out;
  if (v.is_undefined()) return out;
  if (v.kind() != Value::Kind::data) fail("'" + type_name(v) + "' object is not iterable");
  const Json& j = v.json();
  if (j.is_array()) {
    for (const auto& x : j) out.push_back(v.alias(x));
  } else if (j.is_object()) {
    for (const auto& [k, x] : j.items()) out.emplace_back(Json(k));
  } else if (j.is_string()) {
    for (std::uint32_t c : decode_utf8(j.get_ref<const std::string&>())) {
      std::string s;
      append_utf8(s, c);
      out.emplace_back(Json(std::move(s)));
    }
  } else {
    fail("'" + type_name(v) + "' object is not iterable");
  }
  return out;
}

Value getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::undefined: fail("'" + obj.name() + "' is undefined");
    case Value::Kind::ns: {
      Value* v = obj.ns()->find(name);
      return v ? *v : Value::undefined(name);
    }
    case Value::Kind::callable: return Value::undefined(name);
    case Value::Kind::data: break;
  }
  Value m = bound_method(obj, name);
  if (!m.is_undefined()) return m;
  const Json& j = obj.json();
  if (j.is_object()) {
    auto it = j.find(name);
    if (it != j.end()) return obj.alias(*it);
  }
  return Value::undefined(name);
}

Value getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail("'" + obj.name() + "' is undefined");
  if (obj.kind() == Value::Kind::ns) return key.is_string() ? getattr(obj, key.str()) : Value::undefined("item");
  if (!obj.is_data()) return Value::undefined("item");
  const Json& j = obj.json();
  if (key.is_data() && key.json().is_number_integer() && (j.is_array() || j.is_string())) {
    std::int64_t i = key.json().get<std::int64_t>();
    if (j.is_array()) {
      auto n = static_cast<std::int64_t>(j.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(key.json().get<std::int64_t>()));
      return obj.alias(j[static_cast<std::size_t>(i)]);
    }
    auto cps = decode_utf8(j.get_ref<const std::string&>());
    auto n = static_cast<std::int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("index");
    std::string s;
    append_utf8(s, cps[static_cast<std::size_t>(i)]);
    return Value(Json(std::move(s)));
  }
  if (key.is_string()) {
    if (j.is_object()) {
      auto it = j.find(key.str());
      if (it != j.end()) return obj.alias(*it);
    }
    return getattr(obj, key.str());
  }
  return Value::undefined("item");
}

Value apply_filter(const std::string& name, const Value& v, Args& a) {
  if (name == "trim") {
    a.check("trim", 1, {"chars"});
    return Value(Json(strip(value_str(v), a.get(0, "chars"), true, true)));
  }
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) = json.dumps.
    a.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
    DumpOptions o;
    o.ensure_ascii = truthy(a.get(0, "ensure_ascii", Value(Json(false))));
    Value indent = a.get(1, "indent");
    if (!indent.is_undefined() && !indent.is_none()) {
      if (indent.is_string()) fail("tojson: a string indent is not supported");
      o.indent = static_cast<int>(std::clamp<std::int64_t>(need_int(indent, "tojson indent"), 0, 64));
    }
    Value seps = a.get(2, "separators");
    if (!seps.is_undefined() && !seps.is_none()) {
      if (!seps.is_data() || !seps.json().is_array() || seps.json().size() != 2 || !seps.json()[0].is_string() ||
          !seps.json()[1].is_string())
        fail("tojson: separators must be a pair of strings");
      o.item_sep = seps.json()[0].get<std::string>();
      o.key_sep = seps.json()[1].get<std::string>();
    }
    o.sort_keys = truthy(a.get(3, "sort_keys"));
    return Value(Json(py_json_dumps(to_json_arg(v, "tojson"), o)));
  }
  if (name == "length" || name == "count") {
    a.check(name.c_str(), 0, {});
    if (v.is_undefined()) return Value(Json(0));
    if (v.is_string()) return Value(Json(utf8_length(v.str())));
    if (v.is_data() && (v.json().is_array() || v.json().is_object())) return Value(Json(v.json().size()));
    fail("object of type '" + type_name(v) + "' has no len()");
  }
  if (name == "string") {
    a.check("string", 0, {});
    return Value(Json(value_str(v)));
  }
  if (name == "upper" || name == "lower") {
    a.check(name.c_str(), 0, {});
    return Value(Json(map_case(value_str(v), name == "upper")));
  }
  if (name == "capitalize") return Value(Json(capitalize(value_str(v))));
  if (name == "title") return Value(Json(title(value_str(v))));
  if (name == "default" || name == "d") {
    a.check("default", 2, {"default_value", "boolean"});
    bool use = v.is_undefined() || (truthy(a.get(1, "boolean")) && !truthy(v));
    return use ? a.get(0, "default_value", Value(Json(""))) : v;
  }
  if (name == "join") {
    a.check("join", 2, {"d", "attribute"});
    std::string sep = value_str(a.get(0, "d", Value(Json(""))));
    Value attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += value_str(attr.is_undefined() ? x : attr_path(x, value_str(attr)));
    }
    return Value(Json(std::move(out)));
  }
  if (name == "items") {
    a.check("items", 0, {});
    Json out = Json::array();
    if (v.is_undefined()) return Value(std::move(out));
    if (!v.is_data() || !v.json().is_object()) fail("items needs a mapping, got '" + type_name(v) + "'");
    for (const auto& [k, x] : v.json().items()) out.push_back(Json::array({k, x}));
    return Value(std::move(out));
  }
  if (name == "list") {
    a.check("list", 0, {});
    Json out = Json::array();
    for (const Value& x : iterate(v)) out.push_back(x.to_json());
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    a.check(name.c_str(), 0, {});
    auto items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "selectattr") return select(v, a, true, false);
  if (name == "rejectattr") return select(v, a, true, true);
  if (name == "select") return select(v, a, false, false);
  if (name == "reject") return select(v, a, false, true);
  if (name == "map") {
    Json out = Json::array();
    Value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
      a.check("map", 0, {"attribute", "default"});
      Value dflt = a.get(99, "default");
      for (const Value& x : iterate(v)) {
        Value r = attr_path(x, value_str(attr));
        out.push_back((r.is_undefined() && !dflt.is_undefined() ? dflt : r).to_json());
      }
      return Value(std::move(out));
    }
    if (a.pos.empty()) fail("map needs a filter name or attribute=");
    Args fargs;
    fargs.renderer = a.renderer;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    fargs.kw = a.kw;
    std::string fname = need_str(a.pos[0], "map filter name");
    for (const Value& x : iterate(v)) out.push_back(apply_filter(fname, x, fargs).to_json());
    return Value(std::move(out));
  }
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return html_escape(value_str(v));
  if (name == "replace") {
    a.check("replace", 3, {"old", "new", "count"});
    Value cnt = a.get(2, "count");
    return Value(Json(replace(value_str(v), value_str(a.get(0, "old")), value_str(a.get(1, "new")),
                              cnt.is_undefined() || cnt.is_none() ? -1 : need_int(cnt, "replace count"))));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = decode_utf8(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value(Json(encode_utf8(cps, 0, cps.size())));
    }
    Json out = Json::array();
    auto items = iterate(v);
    for (auto it = items.rbegin(); it != items.rend(); ++it) out.push_back(it->to_json());
    return Value(std::move(out));
  }
  if (name == "int") {
    if (is_number(v)) return Value(Json(static_cast<std::int64_t>(as_double(v))));
    if (v.is_string()) {
      try {
        std::size_t used = 0;
        std::string s = strip(v.str(), Value(), true, true);
        long long n = std::stoll(s, &used);
        if (used == s.size()) return Value(Json(n));
      } catch (const std::exception&) {
      }
    }
    return a.get(0, "default", Value(Json(0)));
  }
  if (name == "float") {
    if (is_number(v)) return Value(Json(as_double(v)));
    if (v.is_string()) {
      try {
        std::size_t used = 0;
        std::string s = strip(v.str(), Value(), true, true);
        double d = std::stod(s, &used);
        if (used == s.size()) return Value(Json(d));
      } catch (const std::exception&) {
      }
    }
    return a.get(0, "default", Value(Json(0.0)));
  }
  if (name == "abs") {
    if (!is_number(v)) fail("bad operand type for abs(): '" + type_name(v) + "'");
    if (v.json().is_number_float()) return Value(Json(std::fabs(v.json().get<double>())));
    std::int64_t n = need_int(v, "abs");
    if (n == INT64_MIN) fail("integer overflow");
    return Value(Json(n < 0 ? -n : n));
  }
  if (name == "indent") {
    a.check("indent", 3, {"width", "first", "blank"});
    Value w = a.get(0, "width", Value(Json(4)));
    std::string pad = w.is_string() ? w.str() : std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(need_int(w, "indent"), 0, 256)), ' ');
    bool first = truthy(a.get(1, "first")), blank = truthy(a.get(2, "blank"));
    std::string s = value_str(v), out;
    std::size_t pos = 0;
    bool line0 = true;
    while (pos <= s.size()) {
      std::size_t nl = s.find('\n', pos);
      std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      bool indent = (line0 ? first : true) && (blank || !line.empty());
      if (!line0) out += '\n';
      out += (indent ? pad : "") + line;
      line0 = false;
      if (nl == std::string::npos) break;
      pos = nl + 1;
    }
    return Value(Json(std::move(out)));
  }
  fail("no filter named '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, Args& a) {
  const bool data = v.is_data();
  const Json* j = data ? &v.json() : nullptr;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return data && j->is_object();
  if (name == "number") return data && (j->is_number() || j->is_boolean());
  if (name == "integer") return data && j->is_number_integer();
  if (name == "float") return data && j->is_number_float();
  if (name == "boolean") return data && j->is_boolean();
  if (name == "true") return data && j->is_boolean() && j->get<bool>();
  if (name == "false") return data && j->is_boolean() && !j->get<bool>();
  // Jinja's Undefined is iterable (empty) and has len(): `undefined is iterable` is true, as in Jinja.
  if (name == "iterable") return v.is_undefined() || (data && (j->is_array() || j->is_object() || j->is_string()));
  if (name == "sequence") return v.is_undefined() || (data && (j->is_array() || j->is_object() || j->is_string()));
  if (name == "callable") return v.kind() == Value::Kind::callable;
  if (name == "lower") return v.is_string() && map_case(v.str(), false) == v.str();
  if (name == "upper") return v.is_string() && map_case(v.str(), true) == v.str();
  if (name == "odd" || name == "even") {
    std::int64_t n = need_int(v, name.c_str());
    return (n % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    std::int64_t d = need_int(a.get(0, "num"), "divisibleby");
    if (d == 0) fail("integer division or modulo by zero");
    return need_int(v, "divisibleby") % d == 0;
  }
  if (!a.has(0, "other")) fail("no test named '" + name + "' without an argument");
  Value o = a.get(0, "other");
  if (name == "equalto" || name == "eq" || name == "==") return py_equal(v, o);
  if (name == "ne" || name == "!=") return !py_equal(v, o);
  if (name == "sameas") return py_equal(v, o) && (!data || !(j->is_object() || j->is_array()) || &v.json() == &o.json());
  if (name == "lt" || name == "lessthan" || name == "<") return py_compare(v, o) < 0;
  if (name == "le" || name == "<=") return py_compare(v, o) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return py_compare(v, o) > 0;
  if (name == "ge" || name == ">=") return py_compare(v, o) >= 0;
  if (name == "in") return py_contains(o, v);
  fail("no test named '" + name + "'");
}

Value bound_method(const Value& obj, const std::string& name) {
  if (!obj.is_data()) return Value();
  const Json& j = obj.json();
  auto method = [&](auto fn) { return Value::callable(name, [obj, fn](Args& a) -> Value { return fn(obj, a); }); };
  if (j.is_string()) {
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return method([name](const Value& o, Args& a) {
        a.check(name.c_str(), 1, {});
        return Value(Json(strip(o.str(), a.get(0, ""), name != "rstrip", name != "lstrip")));
      });
    if (name == "startswith" || name == "endswith")
      return method([name](const Value& o, Args& a) {
        a.check(name.c_str(), 1, {});
        return Value(Json(starts_or_ends(o.str(), a.get(0, "prefix"), name == "startswith")));
      });
    if (name == "split")
      return method([](const Value& o, Args& a) {
        a.check("split", 2, {"sep", "maxsplit"});
        Value m = a.get(1, "maxsplit");
        return Value(split(o.str(), a.get(0, "sep"), m.is_undefined() ? -1 : need_int(m, "split maxsplit")));
      });
    if (name == "replace")
      return method([](const Value& o, Args& a) {
        a.check("replace", 3, {"count"});
        Value c = a.get(2, "count");
        return Value(Json(replace(o.str(), need_str(a.get(0, "old"), "replace"), need_str(a.get(1, "new"), "replace"),
                                  c.is_undefined() ? -1 : need_int(c, "replace count"))));
      });
    if (name == "upper" || name == "lower")
      return method([name](const Value& o, Args&) { return Value(Json(map_case(o.str(), name == "upper"))); });
    if (name == "capitalize") return method([](const Value& o, Args&) { return Value(Json(capitalize(o.str()))); });
    if (name == "title") return method([](const Value& o, Args&) { return Value(Json(title(o.str()))); });
    if (name == "find" || name == "count")
      return method([name](const Value& o, Args& a) {
        a.check(name.c_str(), 1, {});
        const std::string& sub = need_str(a.get(0, "sub"), name.c_str());
        const std::string& s = o.str();
        if (name == "find") {
          std::size_t k = s.find(sub);
          return Value(Json(k == std::string::npos ? std::int64_t{-1} : static_cast<std::int64_t>(utf8_length(s.substr(0, k)))));
        }
        if (sub.empty()) return Value(Json(utf8_length(s) + 1));
        std::int64_t n = 0;
        for (std::size_t k = s.find(sub); k != std::string::npos; k = s.find(sub, k + sub.size())) ++n;
        return Value(Json(n));
      });
    if (name == "join")
      return method([](const Value& o, Args& a) {
        a.check("join", 1, {});
        std::string out;
        bool first = true;
        for (const Value& x : iterate(a.get(0, "iterable"))) {
          if (!first) out += o.str();
          first = false;
          out += need_str(x, "str.join");
        }
        return Value(Json(std::move(out)));
      });
    return Value();
  }
  if (j.is_object()) {
    if (name == "items" || name == "keys" || name == "values")
      return method([name](const Value& o, Args& a) {
        a.check(name.c_str(), 0, {});
        Json out = Json::array();
        for (const auto& [k, x] : o.json().items())
          out.push_back(name == "items" ? Json::array({k, x}) : name == "keys" ? Json(k) : x);
        return Value(std::move(out));
      });
    if (name == "get")
      return method([](const Value& o, Args& a) {
        a.check("get", 2, {});
        Value k = a.get(0, "key");
        if (k.is_string()) {
          auto it = o.json().find(k.str());
          if (it != o.json().end()) return o.alias(*it);
        }
        return a.get(1, "default", Value(Json(nullptr)));
      });
  }
  return Value();
}

std::vector<std::pair<std::string, Value>> global_functions(const RenderOptions& opt) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](Args& a) -> Value {
    throw EvalRaise{value_str(a.get(0, "message"))};
  }));
  std::tm now{};
  if (opt.now) {
    now = *opt.now;
  } else {
    std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    localtime_r(&t, &now);
  }
  g.emplace_back("strftime_now", Value::callable("strftime_now", [now](Args& a) -> Value {
    a.check("strftime_now", 1, {});
    const std::string& fmt = need_str(a.get(0, "format"), "strftime_now");
    if (fmt.empty()) return Value(Json(""));
    char buf[1024];
    std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &now);
    if (n == 0) fail("strftime_now: format too long or empty result");
    return Value(Json(std::string(buf, n)));
  }));
  g.emplace_back("namespace", Value::callable("namespace", [](Args& a) -> Value {
    auto ns = std::make_shared<Namespace>();
    auto add = [&](const std::string& k, const Value& v) {
      if (!v.is_data() && !v.is_undefined()) fail("a namespace attribute holds data, not a " + type_name(v));
      if (Value* slot = ns->find(k)) *slot = v;
      else ns->attrs.emplace_back(k, v);
    };
    for (const Value& p : a.pos) {
      if (!p.is_data() || !p.json().is_object()) fail("namespace() takes a mapping or keyword arguments");
      for (const auto& [k, x] : p.json().items()) add(k, p.alias(x));
    }
    for (const auto& [k, v] : a.kw) add(k, v);
    return Value(ns);
  }));
  g.emplace_back("dict", Value::callable("dict", [](Args& a) -> Value {
    Json out = Json::object();
    for (const Value& p : a.pos) {
      if (!p.is_data() || !p.json().is_object()) fail("dict() takes a mapping or keyword arguments");
      for (const auto& [k, x] : p.json().items()) out[k] = x;
    }
    for (const auto& [k, v] : a.kw) out[k] = v.to_json();
    return Value(std::move(out));
  }));
  g.emplace_back("range", Value::callable("range", [](Args& a) -> Value {
    a.check("range", 3, {});
    std::int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = need_int(a.pos[0], "range");
    } else if (a.pos.size() >= 2) {
      start = need_int(a.pos[0], "range");
      stop = need_int(a.pos[1], "range");
      if (a.pos.size() == 3) step = need_int(a.pos[2], "range");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    Json out = Json::array();
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 100000) fail("range too big: Jinja's sandbox allows 100000 items");
      out.push_back(i);
    }
    return Value(std::move(out));
  }));
  return g;
}

}  // namespace ax::jinja::detail
