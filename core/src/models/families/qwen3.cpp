// qwen3 (Qwen3ForCausalLM, Qwen3Config): llama plus RMSNorm of q and k over head_dim before RoPE (norm_rope).
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

// Qwen3 and Qwen3-MoE configs carry a sliding_window value but use it only when use_sliding_window is set.
void refuse_qwen3_window(const Reader& r) {
  if (r.boolean_or("use_sliding_window", false)) throw r.bad("use_sliding_window", "true is not supported");
}

const Family& qwen3_family() {
  static const Family f = [] {
    Family f;
    f.name = "qwen3";
    f.config_class = "Qwen3Config";
    f.summary = "Qwen3 dense decoder (q/k RMSNorm)";
    f.defaults.num_kv_heads = 32;
    f.defaults.head_dim = 128;
    f.reads_attention_bias = true;
    f.read = [](const Reader& r, HfConfig& c) {
      c.qk_norm = true;
      refuse_qwen3_window(r);
    };
    f.presets = {{"tiny-qwen3", [](nlohmann::json& c) {
                    c.update({{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"intermediate_size", 128},
                              {"head_dim", 32}, {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", true}, {"attention_bias", false},
                              {"use_sliding_window", false}, {"sliding_window", nullptr},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
