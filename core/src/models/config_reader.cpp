#include "models/config_reader.hpp"

#include <cmath>
#include <functional>

namespace ax::models {
using nlohmann::json;

namespace {



// transformers' _compute_yarn_parameters inputs. original_max_position_embeddings as its standardize_rope_params
// resolves it: a top-level key wins, then the rope dict's, then max_position_embeddings.
void parse_yarn(RopeConfig& rope, const Reader& p, const Reader& r, const std::function<std::string(const std::string&)>& sub) {
  const char* omp = "original_max_position_embeddings";
  if (r.has(omp)) rope.original_max_position = r.positive(omp);
  else if (p.has(omp)) rope.original_max_position = p.positive(omp);
  else if (r.has("max_position_embeddings")) rope.original_max_position = r.positive("max_position_embeddings");
  else throw r.bad(sub(omp), "is required for rope_type yarn (or max_position_embeddings)");
  auto positive_or = [&](const char* k, double def) {
    const double v = p.number_or(k, def);
    if (!(v > 0) || !std::isfinite(v)) throw r.bad(sub(k), str("must be a finite number > 0, got ", v));
    return v;
  };
  // `or 32` / `or 1` in transformers: 0 counts as unset there too.
  rope.beta_fast = p.has("beta_fast") && p.number_or("beta_fast", 0) != 0 ? positive_or("beta_fast", 32) : 32;
  rope.beta_slow = p.has("beta_slow") && p.number_or("beta_slow", 0) != 0 ? positive_or("beta_slow", 1) : 1;
  rope.truncate = p.boolean_or("truncate", true);
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (p.has("attention_factor")) {
    rope.attention_factor = positive_or("attention_factor", 1.0);
  } else {
    const double mscale = p.number_or("mscale", 0), mscale_all_dim = p.number_or("mscale_all_dim", 0);
    rope.attention_factor = mscale != 0 && mscale_all_dim != 0
                                ? get_mscale(rope.factor, mscale) / get_mscale(rope.factor, mscale_all_dim)
                                : get_mscale(rope.factor, 1.0);
    if (!(rope.attention_factor > 0) || !std::isfinite(rope.attention_factor))
      throw r.bad(sub("mscale"), str("gives the attention factor ", rope.attention_factor, " (must be finite and > 0)"));
  }
}

}  // namespace

RopeConfig parse_rope(const json& j, const Reader& r, double default_theta, double partial_default) {
  RopeConfig rope;
  // transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x wrote rope_theta and rope_scaling.
  const json* params = nullptr;
  std::string where;
  if (r.has("rope_parameters")) {
    params = &j["rope_parameters"];
    where = "rope_parameters";
  } else if (r.has("rope_scaling")) {
    params = &j["rope_scaling"];
    where = "rope_scaling";
  }
  rope.theta = r.number_or("rope_theta", default_theta);
  if (partial_default > 0) {
    // transformers' standardize_rope_params moves a top-level partial_rotary_factor into the rope dict.
    const bool in_dict = params && params->is_object() && params->contains("partial_rotary_factor");
    const std::string key = in_dict ? where + ".partial_rotary_factor" : std::string("partial_rotary_factor");
    const double f = in_dict ? Reader{*params, r.source}.number_or("partial_rotary_factor", partial_default)
                             : r.number_or("partial_rotary_factor", partial_default);
    if (!(f > 0 && f <= 1)) throw r.bad(key, str("must be in (0, 1], got ", f));
    rope.partial_rotary_factor = f;
  }
  if (!params) {
    if (!(rope.theta > 0) || !std::isfinite(rope.theta))
      throw r.bad("rope_theta", str("must be a finite number > 0, got ", rope.theta));
    return rope;
  }
  if (!params->is_object()) throw r.bad(where, "must be an object");
  Reader p{*params, r.source};
  auto sub = [&](const std::string& k) { return where + "." + k; };
  if (p.has("rope_theta")) rope.theta = p.number_or("rope_theta", rope.theta);
  // theta <= 0 gives infinite or NaN inverse frequencies: every forward pass would be NaN.
  if (!(rope.theta > 0) || !std::isfinite(rope.theta))
    throw r.bad(p.has("rope_theta") ? sub("rope_theta") : "rope_theta", str("must be a finite number > 0, got ", rope.theta));
  rope.type = p.string_or("rope_type", p.string_or("type", "default"));
  // Part of head_dim rotated (phi, stablelm): none of these families do it.
  if (partial_default == 0 && p.number_or("partial_rotary_factor", 1.0) != 1.0) throw r.bad(sub("partial_rotary_factor"), "must be 1 (partial rotary is not supported)");
  if (rope.type == "default") return rope;
  if (rope.type != "linear" && rope.type != "llama3" && rope.type != "yarn" && rope.type != "dynamic")
    throw r.bad(sub("rope_type"), str("'", rope.type, "' is not supported (supported: default, linear, llama3, yarn, dynamic)"));
  if (!p.has("factor")) throw r.bad(sub("factor"), str("is required for rope_type ", rope.type));
  rope.factor = p.number_or("factor", 1.0);
  if (!(rope.factor > 0) || !std::isfinite(rope.factor))
    throw r.bad(sub("factor"), str("must be a finite number > 0, got ", rope.factor));
  if (rope.type == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!p.has(k)) throw r.bad(sub(k), "is required for rope_type llama3");
    rope.low_freq_factor = p.number_or("low_freq_factor", 1.0);
    rope.high_freq_factor = p.number_or("high_freq_factor", 4.0);
    rope.original_max_position = p.integer("original_max_position_embeddings");
    if (rope.high_freq_factor == rope.low_freq_factor) throw r.bad(sub("high_freq_factor"), "must differ from low_freq_factor");
  }
  if (rope.type == "yarn") parse_yarn(rope, p, r, sub);
  if (rope.type == "dynamic") {
    // The length the base is scaled from (transformers reads config.max_position_embeddings; no class default
    // is assumed here).
    if (!r.has("max_position_embeddings")) throw r.bad("max_position_embeddings", "is required for rope_type dynamic");
    rope.max_position = r.positive("max_position_embeddings");
  }
  return rope;
}


int64_t sliding_window_or(const Reader& r, int64_t missing) {
  return r.j.contains("sliding_window") ? (r.has("sliding_window") ? r.positive("sliding_window") : -1) : missing;
}

std::optional<std::vector<bool>> sliding_layer_types(const Reader& r, int64_t num_layers) {
  if (!r.has("layer_types")) return std::nullopt;
  const json& lt = r.j["layer_types"];
  if (!lt.is_array() || static_cast<int64_t>(lt.size()) != num_layers)
    throw r.bad("layer_types", str("must be a list of num_hidden_layers = ", num_layers, " entries"));
  std::vector<bool> out(num_layers);
  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string v = lt[i].is_string() ? lt[i].get<std::string>() : "";
    if (v != "full_attention" && v != "sliding_attention")
      throw r.bad(str("layer_types[", i, "]"), str("must be \"full_attention\" or \"sliding_attention\", got ", lt[i].dump()));
    out[i] = v == "sliding_attention";
  }
  return out;
}

void read_experts(const Reader& r, HfConfig& c, double aux_default) {
  c.intermediate_size = r.positive("intermediate_size");
  c.num_experts = r.has("num_experts") ? r.positive("num_experts") : r.positive("num_local_experts");
  c.top_k = r.positive("num_experts_per_tok");
  if (c.top_k > c.num_experts)
    throw r.bad("num_experts_per_tok", str(c.top_k, " exceeds the number of experts ", c.num_experts));
  c.router_aux_loss_coef = r.number_or("router_aux_loss_coef", aux_default);
  c.output_router_logits = r.boolean_or("output_router_logits", false);
  c.moe_intermediate_size = c.intermediate_size;  // the family's reader changes it where the experts differ
}

}  // namespace ax::models
