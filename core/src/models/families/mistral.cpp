// mistral (MistralForCausalLM, MistralConfig): llama without biases, one sliding window on every layer.
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

const Family& mistral_family() {
  static const Family f = [] {
    Family f;
    f.name = "mistral";
    f.config_class = "MistralConfig";
    f.summary = "Mistral dense decoder (sliding-window attention)";
    f.defaults.num_kv_heads = 8;
    f.read = [](const Reader& r, HfConfig& c) {
      // Every layer, when set; a missing key is MistralConfig's 4096, null none.
      const int64_t w = sliding_window_or(r, 4096);
      if (w > 0) c.layer_window.assign(c.num_layers, w);
      // MistralForCausalLM warns about layer_types and attends with the one window everywhere (alternating
      // layers are the ministral family's).
      if (r.has("layer_types"))
        throw r.bad("layer_types", "is not supported for mistral (transformers' Mistral ignores it; alternating "
                                   "sliding/full layers are the ministral architecture)");
    };
    f.presets = {{"tiny-mistral", [](nlohmann::json& c) {
                    c.update({{"architectures", {"MistralForCausalLM"}}, {"model_type", "mistral"}, {"intermediate_size", 128},
                              {"head_dim", 16}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"sliding_window", 256},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
