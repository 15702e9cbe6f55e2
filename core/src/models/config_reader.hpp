// The checked reader of a config.json (config.json's keys, each error naming the file and the key) and the
// pieces of a config the families share: RoPE (rope_parameters / rope_theta + rope_scaling), sliding windows and
// layer_types, the MoE keys. Each family's reader (models/families/<name>.cpp) is made of these.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/hf_config.hpp"

namespace ax::models {

struct Reader {
  const nlohmann::json& j;
  const std::string& source;

  UsageError bad(const std::string& key, const std::string& msg) const {
    return UsageError(str(source, ": '", key, "' ", msg));
  }
  bool has(const std::string& key) const { return j.contains(key) && !j[key].is_null(); }
  int64_t integer(const std::string& key) const {
    if (!has(key)) throw bad(key, "is missing");
    if (!j[key].is_number_integer()) throw bad(key, str("must be an integer, got ", j[key].dump()));
    return j[key].get<int64_t>();
  }
  int64_t positive(const std::string& key) const {
    int64_t v = integer(key);
    if (v <= 0) throw bad(key, str("must be positive, got ", v));
    return v;
  }
  int64_t integer_or(const std::string& key, int64_t def) const { return has(key) ? integer(key) : def; }
  double number_or(const std::string& key, double def) const {
    if (!has(key)) return def;
    if (!j[key].is_number()) throw bad(key, str("must be a number, got ", j[key].dump()));
    return j[key].get<double>();
  }
  bool boolean_or(const std::string& key, bool def) const {
    if (!has(key)) return def;
    if (!j[key].is_boolean()) throw bad(key, str("must be true or false, got ", j[key].dump()));
    return j[key].get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    if (!j[key].is_string()) throw bad(key, str("must be a string, got ", j[key].dump()));
    return j[key].get<std::string>();
  }
  // Token ids may be an int or a list (generation configs); we keep the first.
  int64_t token_id(const std::string& key) const {
    if (!has(key)) return -1;
    const nlohmann::json& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
    throw bad(key, str("must be a token id, got ", v.dump()));
  }
};

// The RoPE of the config (transformers 5's rope_parameters, or 4.x's rope_theta + rope_scaling); `default_theta`
// is the class's when the config gives none.
// `partial_default` > 0: the family reads partial_rotary_factor (in the rope dict or at the top level) with that
// class default; 0: a partial_rotary_factor other than 1 is refused.
RopeConfig parse_rope(const nlohmann::json& j, const Reader& r, double default_theta, double partial_default = 0.0);

// `sliding_window`: its value, -1 when null, `missing` when the key is absent (the class default).
int64_t sliding_window_or(const Reader& r, int64_t missing);
// `layer_types` (one "full_attention" | "sliding_attention" per layer): which layers slide; nullopt when absent.
std::optional<std::vector<bool>> sliding_layer_types(const Reader& r, int64_t num_layers);
// The keys every MoE family reads: intermediate_size, the expert count (num_experts or num_local_experts),
// num_experts_per_tok, router_aux_loss_coef (`aux_default`: the class's), output_router_logits.
void read_experts(const Reader& r, HfConfig& c, double aux_default);

}  // namespace ax::models
