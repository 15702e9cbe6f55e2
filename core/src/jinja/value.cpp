#include "jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ax::jinja::detail {

// Decodes one code point at s[i], advancing i; a malformed sequence yields U+FFFD and skips one byte.
static std::uint32_t next_cp(std::string_view s, std::size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 0 : (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : -1;
  if (n < 0 || i + n >= s.size() + (n == 0 ? 1 : 0)) {
    if (n == 0) return s[i++];
    ++i;
    return 0xFFFD;
  }
  std::uint32_t cp = n == 0 ? b : n == 1 ? (b & 0x1F) : n == 2 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k <= n; ++k) {
    auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  i += n + 1;
  return cp;
}

std::vector<std::uint32_t> decode_utf8(std::string_view s) {
  std::vector<std::uint32_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) out.push_back(next_cp(s, i));
  return out;
}

std::string encode_utf8(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size();) {
    next_cp(s, i);
    ++n;
  }
  return n;
}

bool py_isspace(std::uint32_t c) {
  // str.isspace(): bidirectional types WS, B, S, or category Zs.
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::size_t py_whitespace_prefix(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = i;
    if (!py_isspace(next_cp(s, j))) break;
    i = j;
  }
  return i;
}

std::size_t py_whitespace_suffix(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) >> 6) == 0x2 && end - start < 4) --start;
    std::size_t j = start;
    if (!py_isspace(next_cp(s, j)) || j != end) break;
    end = start;
  }
  return s.size() - end;
}

Json Value::to_json() const {
  switch (kind_) {
    case Kind::data: return *data_;
    case Kind::ns: {
      Json o = Json::object();
      for (const auto& [k, v] : ns_->attrs) o[k] = v.to_json();
      return o;
    }
    case Kind::callable: throw std::runtime_error("a function cannot be stored as data");
    case Kind::undefined: break;
  }
  throw std::runtime_error("'" + name_ + "' is undefined");
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return false;
    case Value::Kind::ns:
    case Value::Kind::callable: return true;
    case Value::Kind::data: break;
  }
  const Json& j = v.json();
  switch (j.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_integer: return j.get<std::int64_t>() != 0;
    case Json::value_t::number_unsigned: return j.get<std::uint64_t>() != 0;
    case Json::value_t::number_float: return j.get<double>() != 0.0;
    case Json::value_t::string: return !j.get_ref<const std::string&>().empty();
    default: return !j.empty();
  }
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16, else d.ddde+XX.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::size_t e = s.find('e');
  int exp = std::stoi(s.substr(e + 1));
  std::string mant = s.substr(0, e);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<std::size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<std::size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exp) + 1) + "." + digits.substr(static_cast<std::size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + eb;
}

static std::string py_str_repr(const std::string& s) {
  // repr(str): single quotes unless the text has ' and no ".
  bool sq = s.find('\'') != std::string::npos, dq = s.find('"') != std::string::npos;
  char q = (sq && !dq) ? '"' : '\'';
  std::string out(1, q);
  for (std::uint32_t c : decode_utf8(s)) {
    if (c == static_cast<std::uint32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      append_utf8(out, c);
    }
  }
  return out + q;
}

std::string py_repr(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<std::int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<std::uint64_t>());
    case Json::value_t::number_float: return py_float_repr(j.get<double>());
    case Json::value_t::string: return py_str_repr(j.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : j.items()) {
        out += (first ? "" : ", ") + py_str_repr(k) + ": " + py_repr(v);
        first = false;
      }
      return out + "}";
    }
    default: return "<binary>";
  }
}

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "";
    case Value::Kind::ns: return "<Namespace " + py_repr(v.to_json()) + ">";
    case Value::Kind::callable: return "<function " + v.name() + ">";
    case Value::Kind::data: break;
  }
  return v.json().is_string() ? v.str() : py_repr(v.json());
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::ns: return "Namespace";
    case Value::Kind::callable: return "function";
    case Value::Kind::data: break;
  }
  switch (v.json().type()) {
    case Json::value_t::null: return "NoneType";
    case Json::value_t::boolean: return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "int";
    case Json::value_t::number_float: return "float";
    case Json::value_t::string: return "str";
    case Json::value_t::array: return "list";
    case Json::value_t::object: return "dict";
    default: return "binary";
  }
}

static void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::uint32_t c : decode_utf8(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char b[16];
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c >= 0x10000) {  // a surrogate pair, as json.dumps writes it
        std::uint32_t v = c - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", c);
      }
      out += b;
    } else {
      append_utf8(out, c);
    }
  }
  out += '"';
}

static void dump(std::string& out, const Json& j, const DumpOptions& o, int level) {
  const std::string& isep = o.item_sep;
  const std::string& ksep = o.key_sep;
  auto newline = [&](int lvl) {
    if (o.indent >= 0) out += "\n" + std::string(static_cast<std::size_t>(o.indent) * static_cast<std::size_t>(lvl), ' ');
  };
  switch (j.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_float: {
      double d = j.get<double>();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float_repr(d);
      return;
    }
    case Json::value_t::string: dump_string(out, j.get_ref<const std::string&>(), o.ensure_ascii); return;
    case Json::value_t::array: {
      if (j.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < j.size(); ++i) {
        if (i) out += isep;
        newline(level + 1);
        dump(out, j[i], o, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<const std::string*, const Json*>> items;
      for (const auto& [k, v] : j.items()) items.emplace_back(&k, &v);
      if (o.sort_keys) std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return *a.first < *b.first; });
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += isep;
        newline(level + 1);
        dump_string(out, *items[i].first, o.ensure_ascii);
        out += ksep;
        dump(out, *items[i].second, o, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default: out += py_repr(j); return;  // integers
  }
}

std::string py_json_dumps(const Json& j, const DumpOptions& opt) {
  DumpOptions o = opt;
  if (o.item_sep.empty() && o.key_sep.empty()) {
    o.item_sep = o.indent >= 0 ? "," : ", ";
    o.key_sep = ": ";
  }
  std::string out;
  dump(out, j, o, 0);
  return out;
}

}  // namespace ax::jinja::detail
