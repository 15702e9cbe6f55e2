#include "models/hf_config.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include <ATen/ATen.h>

#include "axengine/error.hpp"
#include "axengine/input_file.hpp"
#include "axengine/strings.hpp"

namespace ax::models {
using nlohmann::json;

namespace {

struct Reader {
  const json& j;
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
    const json& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
    throw bad(key, str("must be a token id, got ", v.dump()));
  }
};

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

RopeConfig parse_rope(const json& j, const Reader& r, double default_theta) {
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
  if (p.number_or("partial_rotary_factor", 1.0) != 1.0) throw r.bad(sub("partial_rotary_factor"), "must be 1 (partial rotary is not supported)");
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

// GptOssConfig: layer_types (default: even layers slide, odd layers are full) with sliding_window (default
// 128; null = none, and then no layer may slide).
std::vector<int64_t> parse_gpt_oss_windows(const json& j, const Reader& r, int64_t num_layers) {
  const int64_t window = j.contains("sliding_window") ? (r.has("sliding_window") ? r.positive("sliding_window") : -1) : 128;
  std::vector<bool> slides(num_layers);
  if (r.has("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != num_layers)
      throw r.bad("layer_types", str("must be a list of num_hidden_layers = ", num_layers, " entries"));
    for (int64_t i = 0; i < num_layers; ++i) {
      if (lt[i] != "full_attention" && lt[i] != "sliding_attention")
        throw r.bad(str("layer_types[", i, "]"), str("must be \"full_attention\" or \"sliding_attention\", got ", lt[i].dump()));
      slides[i] = lt[i] == "sliding_attention";
    }
  } else {
    for (int64_t i = 0; i < num_layers; ++i) slides[i] = (i + 1) % 2 != 0;
  }
  std::vector<int64_t> out(num_layers, -1);
  for (int64_t i = 0; i < num_layers; ++i) {
    if (!slides[i]) continue;
    if (window < 0) throw r.bad(str("layer_types[", i, "]"), "is sliding_attention but sliding_window is null");
    out[i] = window;
  }
  return out;
}

// Qwen2Config: sliding_window counts only with use_sliding_window (default 4096 when the key is missing);
// layer_types, when given, says which layers slide, else layers from max_window_layers (default 28) on do.
std::vector<int64_t> parse_qwen2_windows(const json& j, const Reader& r, int64_t num_layers) {
  int64_t window = -1;
  if (r.boolean_or("use_sliding_window", false))
    window = j.contains("sliding_window") ? (r.has("sliding_window") ? r.positive("sliding_window") : -1) : 4096;
  std::vector<int64_t> out(num_layers, -1);
  if (r.has("layer_types")) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != num_layers)
      throw r.bad("layer_types", str("must be a list of num_hidden_layers = ", num_layers, " entries"));
    for (int64_t i = 0; i < num_layers; ++i) {
      const std::string v = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (v == "full_attention") continue;
      if (v != "sliding_attention")
        throw r.bad(str("layer_types[", i, "]"), str("must be \"full_attention\" or \"sliding_attention\", got ", lt[i].dump()));
      // transformers' create_sliding_window_causal_mask raises on this too.
      if (window < 0) throw r.bad(str("layer_types[", i, "]"), "is sliding_attention but no sliding window is set (use_sliding_window, sliding_window)");
      out[i] = window;
    }
    return out;
  }
  if (window < 0) return {};
  const int64_t from = r.has("max_window_layers") ? r.integer("max_window_layers") : 28;
  for (int64_t i = std::max<int64_t>(from, 0); i < num_layers; ++i) out[i] = window;
  return out;
}

// Gemma3TextConfig as transformers 5 reads it (configuration_gemma3.py): rope_parameters holds one RoPE per
// layer type ({"full_attention": {...}, "sliding_attention": {...}}); the 4.x keys rope_theta (global),
// rope_local_base_freq (local) and rope_scaling (global) fill in what it leaves out, as its
// convert_rope_params_to_dict does.
void parse_gemma3_text(HfConfig& c, const json& j, const Reader& r) {
  const std::string act = r.string_or("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    throw r.bad("hidden_activation", str("'", act, "' is not supported for gemma3_text (only gelu_pytorch_tanh)"));
  c.mlp_act = act;
  c.qk_norm = c.norm_offset = c.sandwich_norms = true;
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", true);
  c.embed_scale = std::sqrt(double(c.hidden_size));
  const double qpas = r.number_or("query_pre_attn_scalar", 256);
  if (!(qpas > 0) || !std::isfinite(qpas)) throw r.bad("query_pre_attn_scalar", str("must be a finite number > 0, got ", qpas));
  c.attn_scale = std::pow(qpas, -0.5);
  // tanh soft-capping: the attention op has no such score transform, and the fused LM-head loss none either.
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (r.has(k)) throw r.bad(k, str("is not supported (must be null, got ", j[k].dump(), "): no soft-capping"));
  if (r.boolean_or("use_bidirectional_attention", false))
    throw r.bad("use_bidirectional_attention", "true is not supported (causal attention only)");
  // Layer types: the list, or every sliding_window_pattern-th layer full (transformers' BC default 6).
  const int64_t window = j.contains("sliding_window") ? (r.has("sliding_window") ? r.positive("sliding_window") : -1) : 4096;
  c.layer_window.assign(c.num_layers, -1);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    bool sliding;
    if (r.has("layer_types")) {
      const json& lt = j["layer_types"];
      if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers)
        throw r.bad("layer_types", str("must be a list of num_hidden_layers = ", c.num_layers, " entries"));
      const std::string v = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (v != "full_attention" && v != "sliding_attention")
        throw r.bad(str("layer_types[", i, "]"), str("must be \"full_attention\" or \"sliding_attention\", got ", lt[i].dump()));
      sliding = v == "sliding_attention";
    } else {
      sliding = (i + 1) % (r.has("sliding_window_pattern") ? r.positive("sliding_window_pattern") : 6) != 0;
    }
    if (sliding && window < 0) throw r.bad("sliding_window", str("is null but layer ", i, " is sliding_attention"));
    if (sliding) c.layer_window[i] = window;
  }
  json rp = r.has("rope_parameters") ? j["rope_parameters"] : json::object();
  if (!rp.is_object()) throw r.bad("rope_parameters", "must be an object");
  for (const auto& [k, v] : rp.items())
    if (k != "full_attention" && k != "sliding_attention")
      throw r.bad("rope_parameters." + k, "is not a layer type (gemma3_text's rope_parameters has one entry per layer "
                                          "type: full_attention, sliding_attention)");
  auto entry = [&](const char* type) {
    json e = rp.contains(type) && !rp[type].is_null() ? rp[type] : json{{"rope_type", "default"}};
    if (!e.is_object()) throw r.bad(str("rope_parameters.", type), "must be an object");
    return e;
  };
  json full = entry("full_attention"), local = entry("sliding_attention");
  if (r.has("rope_scaling")) {
    if (!j["rope_scaling"].is_object()) throw r.bad("rope_scaling", "must be an object");
    full.update(j["rope_scaling"]);
  }
  if (!full.contains("rope_theta")) full["rope_theta"] = r.number_or("rope_theta", 1e6);
  if (!local.contains("rope_theta")) local["rope_theta"] = r.number_or("rope_local_base_freq", 1e4);
  // Each one through parse_rope, as if it were the config's only RoPE (errors name rope_parameters.<key>).
  auto one = [&](const json& params) {
    json g = j;
    g.erase("rope_scaling");
    g.erase("rope_theta");
    g["rope_parameters"] = params;
    return parse_rope(g, Reader{g, r.source}, 1e6);
  };
  c.rope = one(full);
  c.rope_local = one(local);
  c.has_local_rope = true;
  // The forward recomputes dynamic frequencies for the global RoPE only.
  if (c.rope_local.type == "dynamic")
    throw r.bad("rope_parameters.sliding_attention.rope_type", "dynamic is not supported for the sliding layers");
}

// What transformers 5.23's config class of each family takes for a key the config.json leaves out, where
// the families differ (scripts/goldens/make_config_defaults_goldens.py records every class's defaults in
// tests/data/models/config_defaults.json; tests/unit/model_config_defaults_test.cpp holds this parser to it).
struct FamilyDefaults {
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t num_kv_heads = 0;  // 0: num_attention_heads (the class derives it)
  int64_t head_dim = 0;      // 0: hidden_size / num_attention_heads (the modeling code derives it)
};
FamilyDefaults family_defaults(const std::string& t) {
  if (t == "mistral") return {1e-6, 1e4, 8, 0};
  if (t == "qwen2") return {1e-6, 1e4, 32, 0};
  if (t == "qwen3") return {1e-6, 1e4, 32, 128};
  if (t == "qwen3_moe") return {1e-6, 1e4, 4, 0};
  if (t == "mixtral") return {1e-5, 1e6, 8, 0};
  if (t == "gemma3_text") return {1e-6, 1e6, 4, 256};
  if (t == "olmoe") return {1e-5, 1e4, 0, 0};
  if (t == "gpt_oss") return {1e-5, 150000.0, 8, 64};
  return {};  // llama
}

// Upper bounds on the sizes, checked before anything is sized by them (per-layer tables here, the tensor lists
// of the checkpoint check): every shape product stays inside int64, and no per-layer loop runs 10^9 times.
// The exact sizes are then checked against the checkpoint's tensors (models/decoder_checkpoint.hpp).
void check_size_bounds(const HfConfig& c, const Reader& r) {
  constexpr int64_t kMaxLayers = int64_t(1) << 16, kMaxDim = (int64_t(1) << 31) - 1;
  if (c.num_layers > kMaxLayers)
    throw r.bad("num_hidden_layers", str("is ", c.num_layers, ", more than ", kMaxLayers, " (no checkpoint has that many layers)"));
  for (const auto& [key, v] : {std::pair{"vocab_size", c.vocab_size}, std::pair{"hidden_size", c.hidden_size},
                               std::pair{"num_attention_heads", c.num_heads}, std::pair{"num_key_value_heads", c.num_kv_heads},
                               std::pair{"head_dim", c.head_dim}, std::pair{"intermediate_size", c.intermediate_size},
                               std::pair{"moe_intermediate_size", c.moe_intermediate_size},
                               std::pair{c.model_type == "mixtral" || c.model_type == "gpt_oss" ? "num_local_experts" : "num_experts",
                                         c.num_experts}})
    if (v > kMaxDim) throw r.bad(key, str("is ", v, ", more than ", kMaxDim));
}

}  // namespace

bool HfConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw UsageError(str(path, ": not valid JSON: ", e.what()));
  }
}

HfConfig parse_hf_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw UsageError(str(source, ": not a JSON object"));
  Reader r{j, source};
  HfConfig c;
  c.source = source;
  c.model_type = r.string_or("model_type", "");
  if (c.model_type.empty()) throw r.bad("model_type", "is missing");
  c.vocab_size = r.positive("vocab_size");
  c.hidden_size = r.positive("hidden_size");
  c.num_layers = r.positive("num_hidden_layers");
  c.num_heads = r.positive("num_attention_heads");
  const FamilyDefaults d = family_defaults(c.model_type);
  // Missing: the class's default; null: num_attention_heads, what the classes that accept None turn it into.
  c.num_kv_heads = r.has("num_key_value_heads")                                    ? r.positive("num_key_value_heads")
                   : j.contains("num_key_value_heads") || d.num_kv_heads == 0 ? c.num_heads
                                                                                     : d.num_kv_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    throw r.bad("num_key_value_heads",
                str(c.num_kv_heads, " does not divide num_attention_heads ", c.num_heads,
                    j.contains("num_key_value_heads") ? "" : str(" (the key is not given: ", c.model_type, "'s config class default)")));
  if (r.has("head_dim")) {
    c.head_dim = r.positive("head_dim");
  } else if (d.head_dim > 0) {
    c.head_dim = d.head_dim;  // the class's default (qwen3 128, gemma3_text 256, gpt_oss 64), not hidden_size / heads
  } else {
    if (c.hidden_size % c.num_heads != 0)
      throw r.bad("hidden_size", str(c.hidden_size, " is not a multiple of num_attention_heads and head_dim is not given"));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) throw r.bad("head_dim", str("must be even for RoPE, got ", c.head_dim));
  check_size_bounds(c, r);
  c.rms_norm_eps = r.number_or("rms_norm_eps", d.rms_norm_eps);
  // The config class's default_theta where the config gives none (transformers 5: MixtralConfig 1e6,
  // GptOssConfig 150000 and, with no rope keys at all, its default YaRN parameters).
  if (c.model_type == "gpt_oss" && !r.has("rope_parameters") && !r.has("rope_scaling")) {
    json d = j;
    d["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                            {"truncate", false}, {"original_max_position_embeddings", 4096}};
    c.rope = parse_rope(d, Reader{d, source}, 150000.0);
  } else {
    c.rope = parse_rope(j, r, d.rope_theta);
  }
  c.tie_word_embeddings = r.boolean_or("tie_word_embeddings", false);
  // gemma3_text reads hidden_activation instead (parse_gemma3_text); its class ignores hidden_act.
  std::string act = c.model_type == "gemma3_text" ? "silu" : r.string_or("hidden_act", "silu");
  if (act != "silu") throw r.bad("hidden_act", str("'", act, "' is not supported (only silu)"));
  c.bos_token_id = r.token_id("bos_token_id");
  c.eos_token_id = r.token_id("eos_token_id");
  c.pad_token_id = r.token_id("pad_token_id");
  // transformers drops attention probabilities with this rate in training; the attention op has no dropout, so
  // a run would silently train without it.
  const double attention_dropout = r.number_or("attention_dropout", 0.0);
  if (attention_dropout != 0.0)
    throw r.bad("attention_dropout", str("must be 0, got ", attention_dropout, " (attention dropout is not supported)"));

  const std::string& t = c.model_type;
  if (t != "llama" && t != "mistral" && t != "qwen2" && t != "qwen3" && t != "qwen3_moe" && t != "mixtral" &&
      t != "gemma3_text" && t != "olmoe" && t != "gpt_oss")
    throw r.bad("model_type", str("'", t, "' is not a family this parser knows (llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gemma3_text, olmoe, gpt_oss)"));
  // Bias keys only where the family's transformers class reads them; elsewhere the class builds no bias, so a
  // true value (a checkpoint with biases) would be dropped: refused instead.
  const bool reads_attention_bias =
      t == "llama" || t == "qwen3" || t == "qwen3_moe" || t == "gemma3_text" || t == "olmoe" || t == "gpt_oss";
  const bool reads_mlp_bias = t == "llama";
  for (const auto& [key, reads] : {std::pair{"attention_bias", reads_attention_bias}, std::pair{"mlp_bias", reads_mlp_bias}})
    if (!reads && r.boolean_or(key, false))
      throw r.bad(key, str("true is not supported for ", t, " (transformers' ", t, " builds no such bias)"));
  c.qkv_bias = c.o_bias = reads_attention_bias && r.boolean_or("attention_bias", t == "gpt_oss");  // gpt_oss: default true
  c.mlp_bias = reads_mlp_bias && r.boolean_or("mlp_bias", false);
  if (t == "qwen2") c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without

  c.qk_norm = t == "qwen3" || t == "qwen3_moe";
  // Sliding windows as each transformers class applies them. llama has none: its attention ignores a
  // sliding_window key, and so do we.
  if (t == "qwen3" || t == "qwen3_moe") {
    // Qwen3 configs carry a sliding_window value but only use it when use_sliding_window is set.
    if (r.boolean_or("use_sliding_window", false))
      throw r.bad("use_sliding_window", "true is not supported");
  } else if (t == "gemma3_text") {
    parse_gemma3_text(c, j, r);
  } else if (t == "qwen2") {
    c.layer_window = parse_qwen2_windows(j, r, c.num_layers);
  } else if (t == "gpt_oss") {
    c.layer_window = parse_gpt_oss_windows(j, r, c.num_layers);
  } else if (t == "mistral" || t == "mixtral") {
    // Every layer, when set. A missing key is the class default: 4096 for MistralConfig, none for Mixtral.
    const int64_t w = j.contains("sliding_window") ? (r.has("sliding_window") ? r.positive("sliding_window") : -1)
                                                   : (t == "mistral" ? 4096 : -1);
    if (w > 0) c.layer_window.assign(c.num_layers, w);
    // MistralForCausalLM warns about layer_types and attends with the one window everywhere (alternating
    // layers are the ministral family's).
    if (t == "mistral" && r.has("layer_types"))
      throw r.bad("layer_types", "is not supported for mistral (transformers' Mistral ignores it; alternating "
                                 "sliding/full layers are the ministral architecture)");
  }

  if (t == "olmoe") {
    // OlmoeAttention sizes q_norm as hidden_size and k_norm as (hidden_size / heads) · kv_heads, and its
    // config has no head_dim: a different one would not load in transformers.
    if (c.head_dim * c.num_heads != c.hidden_size)
      throw r.bad("head_dim", str(c.head_dim, " is not hidden_size / num_attention_heads = ", c.hidden_size, " / ", c.num_heads,
                                  " (olmoe derives it)"));
    c.qk_norm_full = true;
    if (r.has("clip_qkv")) {
      c.clip_qkv = r.number_or("clip_qkv", 0);
      if (!(c.clip_qkv > 0) || !std::isfinite(c.clip_qkv)) throw r.bad("clip_qkv", str("must be null or a finite number > 0, got ", c.clip_qkv));
    }
  }

  if (t == "qwen3_moe" || t == "mixtral" || t == "olmoe" || t == "gpt_oss") {
    c.intermediate_size = r.positive("intermediate_size");
    c.num_experts = r.has("num_experts") ? r.positive("num_experts") : r.positive("num_local_experts");
    c.top_k = r.positive("num_experts_per_tok");
    if (c.top_k > c.num_experts)
      throw r.bad("num_experts_per_tok", str(c.top_k, " exceeds the number of experts ", c.num_experts));
    c.router_aux_loss_coef = r.number_or("router_aux_loss_coef", t == "olmoe" ? 0.01 : 0.001);
    c.output_router_logits = r.boolean_or("output_router_logits", false);
    if (t == "qwen3_moe") {
      c.moe_intermediate_size = r.positive("moe_intermediate_size");
      c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
      c.decoder_sparse_step = r.has("decoder_sparse_step") ? r.positive("decoder_sparse_step") : 1;
      if (r.has("mlp_only_layers")) {
        if (!j["mlp_only_layers"].is_array()) throw r.bad("mlp_only_layers", "must be a list of layer indices");
        for (const auto& v : j["mlp_only_layers"]) {
          if (!v.is_number_integer()) throw r.bad("mlp_only_layers", "must be a list of layer indices");
          c.mlp_only_layers.push_back(v.get<int64_t>());
        }
      }
    } else if (t == "olmoe") {
      // Every layer is sparse; the experts use intermediate_size; softmax top-k, renormalised only if asked.
      c.moe_intermediate_size = c.intermediate_size;
      c.norm_topk_prob = r.boolean_or("norm_topk_prob", false);
    } else if (t == "gpt_oss") {
      c.moe_intermediate_size = c.intermediate_size;  // every layer is MoE, its experts use intermediate_size
      c.attention_sinks = true;
      for (auto [key, dst] : {std::pair{"swiglu_alpha", &c.swiglu_alpha}, std::pair{"swiglu_limit", &c.swiglu_limit}}) {
        *dst = r.number_or(key, *dst);
        if (!(*dst > 0) || !std::isfinite(*dst)) throw r.bad(key, str("must be a finite number > 0, got ", *dst));
      }
    } else {
      c.moe_intermediate_size = c.intermediate_size;  // mixtral's experts use intermediate_size
      c.norm_topk_prob = true;                        // mixtral always renormalises the top-k weights
      if (r.number_or("router_jitter_noise", 0.0) != 0.0)
        throw r.bad("router_jitter_noise", "must be 0 (jitter is not supported)");
    }
  } else {
    c.intermediate_size = r.positive("intermediate_size");
  }
  if (t == "gpt_oss" && r.has("quantization_config") && j["quantization_config"].is_object() &&
      j["quantization_config"].value("quant_method", json()) == "mxfp4") {
    c.mxfp4_experts = true;
    const json& q = j["quantization_config"];
    for (auto it = q.begin(); it != q.end(); ++it) {
      const std::string k = "quantization_config." + it.key();
      if (it.key() == "quant_method") continue;
      // Which modules transformers leaves unquantised. What the checkpoint stores dense is read as dense
      // anyway: an expert projection is packed exactly when its _blocks/_scales are there.
      if (it.key() == "modules_to_not_convert") {
        bool ok = it->is_null() || it->is_array();
        if (it->is_array())
          for (const auto& v : *it) ok = ok && v.is_string();
        if (!ok) throw r.bad(k, "must be a list of module names");
        continue;
      }
      // Mxfp4Config(dequantize=...) is a load-time choice transformers does not save; anything else is unknown.
      throw r.bad(k, "is not a key of an mxfp4 quantization_config (known: quant_method, modules_to_not_convert)");
    }
  } else {
    c.quant = parse_bnb_config(j, source);
  }
  check_size_bounds(c, r);  // the expert sizes, read since
  // transformers divides by sqrt(mean(x²) + eps): eps <= 0 gives inf or NaN on an all-zero row (padding).
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    throw r.bad("rms_norm_eps", str("must be a finite number > 0, got ", c.rms_norm_eps));
  if (c.rope.type == "dynamic" && c.head_dim <= 2)
    throw r.bad("head_dim", "must be > 2 for rope_type dynamic (its base exponent is d/(d-2))");
  // Defensive: parameters that pass each key's check must still give finite frequencies, or every forward is
  // NaN (the fuzz harness holds the parser to this). Dynamic RoPE is checked where its length is known.
  if (c.head_dim <= 4096 && !at::isfinite(rope_inv_freq(c)).all().item<bool>())
    throw r.bad(c.rope.type == "default" ? "rope_theta" : "rope_parameters",
                str("gives non-finite RoPE frequencies for rope_type ", c.rope.type));
  if (c.has_local_rope && c.head_dim <= 4096 && !at::isfinite(rope_inv_freq(c, c.rope_local)).all().item<bool>())
    throw r.bad("rope_parameters.sliding_attention", str("gives non-finite RoPE frequencies for rope_type ", c.rope_local.type));
  return c;
}

at::Tensor rope_inv_freq(const HfConfig& c, const RopeConfig& rope, int64_t seq_len) {
  HfConfig other = c;
  other.rope = rope;
  return rope_inv_freq(other, seq_len);
}

at::Tensor rope_inv_freq(const HfConfig& c, int64_t seq_len) {
  const int64_t dim = c.head_dim;
  const at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / double(dim);
  at::Tensor inv = 1.0 / at::pow(c.rope.theta, exponents);
  if (c.rope.type == "linear") return inv / c.rope.factor;
  if (c.rope.type == "dynamic") {
    if (seq_len <= c.rope.max_position) return inv;
    // _compute_dynamic_ntk_parameters with a tensor seq_len: the base is computed in fp32, as there.
    const double f = c.rope.factor;
    at::Tensor sl = at::scalar_tensor(seq_len, at::kLong);
    at::Tensor base = c.rope.theta * at::pow(f * sl / double(c.rope.max_position) - (f - 1), double(dim) / double(dim - 2));
    at::Tensor out = 1.0 / at::pow(base, exponents);
    if (!at::isfinite(out).all().item<bool>())  // e.g. a factor beyond fp32: f·L - (f - 1) is inf - inf
      throw UsageError(str(c.source, ": rope_type dynamic with factor ", f, " gives non-finite RoPE frequencies at length ", seq_len));
    return out;
  }
  if (c.rope.type == "yarn") {
    // _compute_yarn_parameters, term for term.
    const double base = c.rope.theta, factor = c.rope.factor, omp = double(c.rope.original_max_position);
    auto correction_dim = [&](double rotations) {
      return (double(dim) * std::log(omp / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = correction_dim(c.rope.beta_fast), high = correction_dim(c.rope.beta_slow);
    if (c.rope.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    at::Tensor pos_freqs = at::pow(base, exponents);
    at::Tensor extrapolation = 1.0 / pos_freqs, interpolation = 1.0 / (factor * pos_freqs);
    at::Tensor ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);
    at::Tensor extrapolation_factor = 1 - ramp;
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  if (c.rope.type != "llama3") return inv;
  // transformers' _compute_llama3_parameters, term for term (fp32).
  const double factor = c.rope.factor, lo = c.rope.low_freq_factor, hi = c.rope.high_freq_factor;
  const double old_len = double(c.rope.original_max_position);
  const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
  at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor llama = at::where(wavelen > low_freq_wavelen, inv / factor, inv);
  at::Tensor smooth = (old_len / wavelen - lo) / (hi - lo);
  at::Tensor smoothed = (1 - smooth) * llama / factor + smooth * llama;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, llama);
}

}  // namespace ax::models
