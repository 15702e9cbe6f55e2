// qwen3_5 (Qwen3_5ForCausalLM, Qwen3_5TextConfig; the text part of the Qwen3.5 checkpoints): a hybrid of Gated
// DeltaNet layers (linear_attention: models/parts/gated_deltanet.cpp) and full-attention layers whose q_proj is
// doubled per head into q and an output gate (attention · sigmoid(gate)), per-head q/k RMSNorms, partial RoPE
// (partial_rotary_factor, default 0.25), (1 + w) RMSNorms, a dense SiLU GLU MLP on every layer.
// Qwen3_5ForCausalLM saves model_type "qwen3_5_text"; the description reads both names.
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

// Qwen3.5 and Qwen3-Next's keys of the linear-attention layers and the layer pattern (families/qwen3_5.cpp):
// layer_types ("linear_attention" | "full_attention" per layer), else every full_attention_interval-th layer
// full (the class's default interval `interval_default`); the Gated DeltaNet's head counts and sizes (defaults
// of Qwen3_5TextConfig, which Qwen3-Next's class shares); the output gate, q/k norms, (1 + w) norms and the
// partial RoPE's rotary dim.
void read_qwen3_5_hybrid(const Reader& r, HfConfig& c, int64_t interval_default) {
  c.qk_norm = true;
  c.norm_offset = true;
  c.attn_output_gate = true;
  const int64_t rot = static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor);
  if (rot < 2 || rot % 2 != 0)
    throw r.bad("partial_rotary_factor", str(c.rope.partial_rotary_factor, " x head_dim ", c.head_dim, " gives the rotary dim ",
                                             rot, " (it must be even and at least 2)"));
  c.rotary_dim = rot;
  auto& g = c.gdn;
  g.conv_kernel = r.has("linear_conv_kernel_dim") ? r.positive("linear_conv_kernel_dim") : 4;
  g.key_dim = r.has("linear_key_head_dim") ? r.positive("linear_key_head_dim") : 128;
  g.value_dim = r.has("linear_value_head_dim") ? r.positive("linear_value_head_dim") : 128;
  g.key_heads = r.has("linear_num_key_heads") ? r.positive("linear_num_key_heads") : 16;
  g.value_heads = r.has("linear_num_value_heads") ? r.positive("linear_num_value_heads") : 32;
  constexpr int64_t kMax = int64_t(1) << 20;
  for (const auto& [key, v] : {std::pair{"linear_conv_kernel_dim", g.conv_kernel}, std::pair{"linear_key_head_dim", g.key_dim},
                               std::pair{"linear_value_head_dim", g.value_dim}, std::pair{"linear_num_key_heads", g.key_heads},
                               std::pair{"linear_num_value_heads", g.value_heads}})
    if (v > kMax) throw r.bad(key, str("is ", v, ", more than ", kMax));
  if (g.value_heads % g.key_heads != 0)
    throw r.bad("linear_num_value_heads", str(g.value_heads, " is not a multiple of linear_num_key_heads ", g.key_heads,
                                              " (each key head serves a whole group of value heads)"));
  c.linear_layers.assign(c.num_layers, false);
  if (r.has("layer_types")) {
    const nlohmann::json& lt = r.j["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers)
      throw r.bad("layer_types", str("must be a list of num_hidden_layers = ", c.num_layers, " entries"));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string v = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (v != "linear_attention" && v != "full_attention")
        throw r.bad(str("layer_types[", i, "]"), str("must be \"linear_attention\" or \"full_attention\", got ", lt[i].dump()));
      c.linear_layers[i] = v == "linear_attention";
    }
    // The class ignores full_attention_interval once layer_types is given: a config with both that disagree
    // was written for another pattern than the one it would get.
    if (r.has("full_attention_interval")) {
      const int64_t n = r.positive("full_attention_interval");
      for (int64_t i = 0; i < c.num_layers; ++i)
        if (c.linear_layers[i] != ((i + 1) % n != 0))
          throw r.bad("layer_types", str("disagrees with full_attention_interval ", n, " at layer ", i, " (",
                                         c.linear_layers[i] ? "linear_attention" : "full_attention", ")"));
    }
  } else {
    const int64_t n = r.has("full_attention_interval") ? r.positive("full_attention_interval") : interval_default;
    for (int64_t i = 0; i < c.num_layers; ++i) c.linear_layers[i] = (i + 1) % n != 0;
  }
}

namespace {
void qwen3_5_preset(nlohmann::json& c) {
  c.update({{"architectures", {"Qwen3_5ForCausalLM"}}, {"model_type", "qwen3_5_text"}, {"intermediate_size", 128},
            {"head_dim", 16}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false}, {"attention_bias", false},
            {"layer_types", {"linear_attention", "full_attention"}}, {"linear_conv_kernel_dim", 4},
            {"linear_key_head_dim", 16}, {"linear_value_head_dim", 16}, {"linear_num_key_heads", 2},
            {"linear_num_value_heads", 4},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}}}});
}
}  // namespace

const Family& qwen3_5_family() {
  static const Family f = [] {
    Family f;
    f.name = "qwen3_5";
    f.also_types = {"qwen3_5_text"};
    f.reads_text_config = true;  // Qwen3_5ForConditionalGeneration (the hub's Qwen3.5 checkpoints)
    f.config_class = "Qwen3_5TextConfig";
    f.summary = "Qwen3.5 dense hybrid (Gated DeltaNet linear attention + gated full attention, partial RoPE)";
    f.defaults.num_kv_heads = 4;
    f.defaults.head_dim = 256;
    f.defaults.partial_rotary_factor = 0.25;
    f.reads_attention_bias = true;
    f.read = [](const Reader& r, HfConfig& c) { read_qwen3_5_hybrid(r, c, 4); };
    f.presets = {{"tiny-qwen3_5", qwen3_5_preset}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
