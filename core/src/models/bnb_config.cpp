#include "models/bnb_config.hpp"

#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
using nlohmann::json;

namespace {

bool given(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

}  // namespace

int64_t BnbQuantState::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

BnbConfig parse_bnb_config(const json& cfg, const std::string& source) {
  BnbConfig out;
  if (!cfg.is_object() || !given(cfg, "quantization_config")) return out;
  const json& q = cfg["quantization_config"];
  auto bad = [&](const std::string& key, const std::string& msg) {
    return UsageError(str(source, ": 'quantization_config", key.empty() ? "" : "." + key, "' ", msg));
  };
  if (!q.is_object()) throw bad("", "must be an object");
  auto boolean = [&](const char* key) {
    if (!given(q, key)) return false;
    if (!q[key].is_boolean()) throw bad(key, str("must be true or false, got ", q[key].dump()));
    return q[key].get<bool>();
  };
  auto string_or = [&](const char* key, const std::string& def) {
    if (!given(q, key)) return def;
    if (!q[key].is_string()) throw bad(key, str("must be a string, got ", q[key].dump()));
    return q[key].get<std::string>();
  };
  // transformers reads a quantization_config without quant_method (written before it existed) as bitsandbytes.
  const std::string method = string_or("quant_method", "bitsandbytes");
  if (method != "bitsandbytes")
    throw bad("quant_method", str("'", method, "' is not supported: axengine loads bitsandbytes 4-bit (nf4) "
                                  "checkpoints, and dense ones"));
  if (boolean("load_in_8bit"))
    throw bad("load_in_8bit", "true is not supported: bitsandbytes 8-bit (LLM.int8) checkpoints cannot be loaded, only 4-bit nf4");
  if (!boolean("load_in_4bit")) throw bad("load_in_4bit", "must be true (a bitsandbytes 4-bit checkpoint)");
  out.quant_type = string_or("bnb_4bit_quant_type", "fp4");  // transformers' default is fp4
  if (out.quant_type != "nf4")
    throw bad("bnb_4bit_quant_type", str("'", out.quant_type, "' is not supported (only nf4)"));
  out.double_quant = boolean("bnb_4bit_use_double_quant");
  out.compute_dtype = string_or("bnb_4bit_compute_dtype", "");
  // Another storage dtype (FSDP-QLoRA's bfloat16) holds the same bytes under another element type; not read.
  const std::string storage = string_or("bnb_4bit_quant_storage", "uint8");
  if (storage != "uint8")
    throw bad("bnb_4bit_quant_storage", str("'", storage, "' is not supported (only uint8)"));
  if (given(q, "llm_int8_skip_modules")) {
    const json& s = q["llm_int8_skip_modules"];
    if (!s.is_array()) throw bad("llm_int8_skip_modules", str("must be a list of module names, got ", s.dump()));
    for (const auto& v : s) {
      if (!v.is_string()) throw bad("llm_int8_skip_modules", str("must be a list of module names, got ", s.dump()));
      out.skip_modules.push_back(v.get<std::string>());
    }
  }
  out.present = true;
  return out;
}

BnbQuantState parse_bnb_quant_state(std::string_view bytes, const std::string& where) {
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    throw UsageError(str(where, ": the quant state is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw UsageError(str(where, ": the quant state is not a JSON object"));
  auto bad = [&](const std::string& key, const std::string& msg) {
    return UsageError(str(where, ": quant state '", key, "' ", msg));
  };
  // bitsandbytes' QuantState.from_dict refuses keys it does not know; so do we, rather than misread a newer layout.
  static const std::set<std::string> known{"quant_type", "blocksize", "dtype", "shape", "nested_blocksize",
                                           "nested_dtype", "nested_offset"};
  for (const auto& [k, v] : j.items())
    if (!known.count(k)) throw bad(k, "is not a key of a bitsandbytes 4-bit quant state");
  auto string = [&](const char* key) {
    if (!given(j, key)) throw bad(key, "is missing");
    if (!j[key].is_string()) throw bad(key, str("must be a string, got ", j[key].dump()));
    return j[key].get<std::string>();
  };
  auto integer = [&](const char* key) {
    if (!given(j, key)) throw bad(key, "is missing");
    if (!j[key].is_number_integer()) throw bad(key, str("must be an integer, got ", j[key].dump()));
    return j[key].get<int64_t>();
  };
  BnbQuantState s;
  s.quant_type = string("quant_type");
  if (s.quant_type != "nf4") throw bad("quant_type", str("'", s.quant_type, "' is not supported (only nf4)"));
  s.blocksize = integer("blocksize");
  if (s.blocksize < 16 || s.blocksize > 4096 || (s.blocksize & (s.blocksize - 1)) != 0)
    throw bad("blocksize", str("must be a power of two in 16..4096, got ", s.blocksize));
  s.dtype = string("dtype");
  if (s.dtype != "float32" && s.dtype != "bfloat16" && s.dtype != "float16")
    throw bad("dtype", str("'", s.dtype, "' is not float32, bfloat16 or float16"));
  if (!given(j, "shape") || !j["shape"].is_array() || j["shape"].empty())
    throw bad("shape", str("must be a non-empty list of sizes, got ", given(j, "shape") ? j["shape"].dump() : "nothing"));
  int64_t n = 1;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0) throw bad("shape", str("must hold positive sizes, got ", j["shape"].dump()));
    const int64_t v = d.get<int64_t>();
    if (n > std::numeric_limits<int64_t>::max() / v) throw bad("shape", str(j["shape"].dump(), " has too many elements"));
    n *= v;
    s.shape.push_back(v);
  }
  if (n % s.blocksize != 0)
    throw bad("blocksize", str(s.blocksize, " does not divide the weight's ", n, " elements (shape ", j["shape"].dump(), ")"));
  const bool any_nested = given(j, "nested_blocksize") || given(j, "nested_dtype") || given(j, "nested_offset");
  if (!any_nested) return s;
  s.nested = true;
  s.nested_blocksize = integer("nested_blocksize");
  if (s.nested_blocksize <= 0 || s.nested_blocksize > 4096)
    throw bad("nested_blocksize", str("must be in 1..4096, got ", s.nested_blocksize));
  s.nested_dtype = string("nested_dtype");
  if (s.nested_dtype != "float32") throw bad("nested_dtype", str("'", s.nested_dtype, "' is not supported (only float32)"));
  if (!given(j, "nested_offset") || !j["nested_offset"].is_number()) throw bad("nested_offset", "must be a number");
  s.nested_offset = j["nested_offset"].get<double>();
  if (!std::isfinite(s.nested_offset) || std::abs(s.nested_offset) > std::numeric_limits<float>::max())
    throw bad("nested_offset", str("must be a finite fp32 value, got ", j["nested_offset"].dump()));
  return s;
}

}  // namespace ax::models
