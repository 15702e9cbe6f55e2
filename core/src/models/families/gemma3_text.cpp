// gemma3_text (Gemma3ForCausalLM, Gemma3TextConfig; gemma-3-1b): (1 + w) RMSNorms, sandwich norms, per-head q/k
// norms, the softmax scale query_pre_attn_scalar^-½, embeddings × √hidden, a GELU-tanh GLU, sliding and full
// layers each with its own RoPE, tied by default.
#include <cmath>

#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

namespace {

// rope_parameters holds one RoPE per layer type ({"full_attention": {...}, "sliding_attention": {...}}); the 4.x
// keys rope_theta (global), rope_local_base_freq (local) and rope_scaling (global) fill in what it leaves out,
// as Gemma3TextConfig's convert_rope_params_to_dict does.
void read_gemma3_ropes(const Reader& r, HfConfig& c) {
  const nlohmann::json& j = r.j;
  nlohmann::json rp = r.has("rope_parameters") ? j["rope_parameters"] : nlohmann::json::object();
  if (!rp.is_object()) throw r.bad("rope_parameters", "must be an object");
  for (const auto& [k, v] : rp.items())
    if (k != "full_attention" && k != "sliding_attention")
      throw r.bad("rope_parameters." + k, "is not a layer type (gemma3_text's rope_parameters has one entry per layer "
                                          "type: full_attention, sliding_attention)");
  auto entry = [&](const char* type) {
    nlohmann::json e = rp.contains(type) && !rp[type].is_null() ? rp[type] : nlohmann::json{{"rope_type", "default"}};
    if (!e.is_object()) throw r.bad(str("rope_parameters.", type), "must be an object");
    return e;
  };
  nlohmann::json full = entry("full_attention"), local = entry("sliding_attention");
  if (r.has("rope_scaling")) {
    if (!j["rope_scaling"].is_object()) throw r.bad("rope_scaling", "must be an object");
    full.update(j["rope_scaling"]);
  }
  if (!full.contains("rope_theta")) full["rope_theta"] = r.number_or("rope_theta", 1e6);
  if (!local.contains("rope_theta")) local["rope_theta"] = r.number_or("rope_local_base_freq", 1e4);
  // Each one through parse_rope, as if it were the config's only RoPE (errors name rope_parameters.<key>).
  auto one = [&](const nlohmann::json& params) {
    nlohmann::json g = j;
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

void read_gemma3_text(const Reader& r, HfConfig& c) {
  const std::string act = r.string_or("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    throw r.bad("hidden_activation", str("'", act, "' is not supported for gemma3_text (only gelu_pytorch_tanh)"));
  c.mlp_act = act;
  c.qk_norm = c.norm_offset = c.sandwich_norms = true;
  c.embed_scale = std::sqrt(double(c.hidden_size));
  const double qpas = r.number_or("query_pre_attn_scalar", 256);
  if (!(qpas > 0) || !std::isfinite(qpas)) throw r.bad("query_pre_attn_scalar", str("must be a finite number > 0, got ", qpas));
  c.attn_scale = std::pow(qpas, -0.5);
  // tanh soft-capping: the attention op has no such score transform, and the fused LM-head loss none either.
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (r.has(k)) throw r.bad(k, str("is not supported (must be null, got ", r.j[k].dump(), "): no soft-capping"));
  if (r.boolean_or("use_bidirectional_attention", false))
    throw r.bad("use_bidirectional_attention", "true is not supported (causal attention only)");
  // Layer types: the list, or every sliding_window_pattern-th layer full (transformers' BC default 6).
  const int64_t window = sliding_window_or(r, 4096);
  const auto types = sliding_layer_types(r, c.num_layers);
  c.layer_window.assign(c.num_layers, -1);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool sliding = types ? (*types)[i]
                               : (i + 1) % (r.has("sliding_window_pattern") ? r.positive("sliding_window_pattern") : 6) != 0;
    if (sliding && window < 0) throw r.bad("sliding_window", str("is null but layer ", i, " is sliding_attention"));
    if (sliding) c.layer_window[i] = window;
  }
  read_gemma3_ropes(r, c);
}

}  // namespace

const Family& gemma3_text_family() {
  static const Family f = [] {
    Family f;
    f.name = "gemma3_text";
    f.config_class = "Gemma3TextConfig";
    f.summary = "Gemma 3 text decoder (1+w sandwich RMSNorms, local/global layers, scaled embeddings)";
    f.defaults = {1e-6, 1e6, 4, 256, true, nullptr};
    f.reads_attention_bias = true;
    f.reads_hidden_act = false;  // it reads hidden_activation
    f.read = read_gemma3_text;
    f.presets = {{"tiny-gemma3", [](nlohmann::json& c) {
                    // As transformers 5 writes a Gemma3TextConfig: one RoPE per layer type, a sliding and a full layer.
                    c.erase("hidden_act");
                    c.update({{"architectures", {"Gemma3ForCausalLM"}}, {"model_type", "gemma3_text"}, {"intermediate_size", 128},
                              {"head_dim", 16}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}, {"attention_bias", false},
                              {"hidden_activation", "gelu_pytorch_tanh"}, {"query_pre_attn_scalar", 16}, {"sliding_window", 64},
                              {"layer_types", {"sliding_attention", "full_attention"}}, {"attn_logit_softcapping", nullptr},
                              {"final_logit_softcapping", nullptr}, {"use_bidirectional_attention", false},
                              {"rope_parameters", {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
                                                   {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
