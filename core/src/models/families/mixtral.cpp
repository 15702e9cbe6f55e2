// mixtral (MixtralForCausalLM, MixtralConfig): mistral's attention (its window only when set) and every layer
// sparse: softmax → top-k, always renormalised, over SiLU-GLU experts of intermediate_size. Hub checkpoints
// store the experts per expert as w1 (gate), w3 (up), w2 (down) under block_sparse_moe.
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

const Family& mixtral_family() {
  static const Family f = [] {
    Family f;
    f.name = "mixtral";
    f.config_class = "MixtralConfig";
    f.summary = "Mixtral sparse MoE (top-k renormalised router)";
    f.defaults = {1e-5, 1e6, 8, 0, false, nullptr};
    f.moe = true;
    f.experts_key = "num_local_experts";
    f.per_expert = PerExpertNames{"w1", "w3", "w2", "block_sparse_moe"};
    f.read = [](const Reader& r, HfConfig& c) {
      const int64_t w = sliding_window_or(r, -1);  // MixtralConfig: none by default
      if (w > 0) c.layer_window.assign(c.num_layers, w);
      read_experts(r, c, 0.001);
      c.norm_topk_prob = true;  // mixtral always renormalises the top-k weights
      if (r.number_or("router_jitter_noise", 0.0) != 0.0) throw r.bad("router_jitter_noise", "must be 0 (jitter is not supported)");
    };
    f.presets = {{"tiny-mixtral", [](nlohmann::json& c) {
                    c.update({{"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"}, {"intermediate_size", 96},
                              {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.02},
                              {"output_router_logits", false}, {"router_jitter_noise", 0.0}, {"head_dim", 16},
                              {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"sliding_window", nullptr},
                              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
