// qwen2 (Qwen2ForCausalLM, Qwen2Config; Qwen2 / Qwen2.5, and Qwen2.5-VL's language model): llama with q/k/v
// biases (none on o_proj) and Qwen2's sliding-window rules.
#include <algorithm>

#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

const Family& qwen2_family() {
  static const Family f = [] {
    Family f;
    f.name = "qwen2";
    f.config_class = "Qwen2Config";
    f.summary = "Qwen2 / Qwen2.5 dense decoder (q/k/v bias, per-layer sliding window)";
    f.defaults.num_kv_heads = 32;
    f.read = [](const Reader& r, HfConfig& c) {
      c.qkv_bias = true;  // Qwen2Attention: q/k/v with bias, o_proj without
      // sliding_window counts only with use_sliding_window (default 4096 when the key is missing); layer_types,
      // when given, says which layers slide, else layers from max_window_layers (default 28) on do.
      const int64_t window = r.boolean_or("use_sliding_window", false) ? sliding_window_or(r, 4096) : -1;
      if (auto slides = sliding_layer_types(r, c.num_layers)) {
        c.layer_window.assign(c.num_layers, -1);
        for (int64_t i = 0; i < c.num_layers; ++i) {
          if (!(*slides)[i]) continue;
          // transformers' create_sliding_window_causal_mask raises on this too.
          if (window < 0)
            throw r.bad(str("layer_types[", i, "]"), "is sliding_attention but no sliding window is set (use_sliding_window, sliding_window)");
          c.layer_window[i] = window;
        }
        return;
      }
      if (window < 0) return;
      c.layer_window.assign(c.num_layers, -1);
      const int64_t from = r.has("max_window_layers") ? r.integer("max_window_layers") : 28;
      for (int64_t i = std::max<int64_t>(from, 0); i < c.num_layers; ++i) c.layer_window[i] = window;
    };
    f.presets = {{"tiny-qwen2", [](nlohmann::json& c) {
                    // As transformers 5 writes a Qwen2.5 config: the window is off (use_sliding_window false), as shipped.
                    c.update({{"architectures", {"Qwen2ForCausalLM"}}, {"model_type", "qwen2"}, {"intermediate_size", 128},
                              {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}, {"use_sliding_window", false},
                              {"sliding_window", nullptr}, {"max_window_layers", 2},
                              {"layer_types", {"full_attention", "full_attention"}},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
