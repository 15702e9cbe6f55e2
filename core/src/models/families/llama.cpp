// llama (LlamaForCausalLM, LlamaConfig): the base decoder the others vary. GQA, head_dim free, every RoPE type;
// attention_bias sets all four attention projections' biases, mlp_bias the MLP's. A sliding_window key is
// ignored, as transformers' llama ignores it.
#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

const Family& llama_family() {
  static const Family f = [] {
    Family f;
    f.name = "llama";
    f.config_class = "LlamaConfig";
    f.summary = "Llama 2/3 decoder (GQA, llama3 RoPE scaling)";
    f.reads_attention_bias = f.reads_mlp_bias = true;
    f.read = [](const Reader&, HfConfig&) {};
    f.presets = {{"tiny-llama", [](nlohmann::json& c) {
                    c.update({{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"intermediate_size", 128},
                              {"head_dim", 16}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true},
                              {"attention_bias", false}, {"mlp_bias", false},
                              {"rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                                                   {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                                   {"original_max_position_embeddings", 256}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
