// gpt_oss (GptOssForCausalLM, GptOssConfig): attention sinks, alternating sliding/full layers, YaRN, biases on
// every attention projection; every layer sparse with MoeKind::topk_softmax_clamped (a router with bias, top-k
// then softmax; experts with biases and the clamped sigmoid GLU on interleaved gate/up columns, stored
// transposed: models/gpt_oss.hpp), MXFP4 expert checkpoints loaded packed.
#include <cmath>

#include "models/config_reader.hpp"
#include "models/family.hpp"

namespace ax::models {

namespace {

void read_gpt_oss(const Reader& r, HfConfig& c) {
  c.qkv_bias = c.o_bias = r.boolean_or("attention_bias", true);  // GptOssConfig: true by default
  // layer_types (default: even layers slide, odd layers are full) with sliding_window (default 128; null = none,
  // and then no layer may slide).
  const int64_t window = sliding_window_or(r, 128);
  const auto types = sliding_layer_types(r, c.num_layers);
  c.layer_window.assign(c.num_layers, -1);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (types ? !(*types)[i] : (i + 1) % 2 == 0) continue;
    if (window < 0) throw r.bad(str("layer_types[", i, "]"), "is sliding_attention but sliding_window is null");
    c.layer_window[i] = window;
  }
  read_experts(r, c, 0.001);  // every layer sparse, its experts of intermediate_size
  c.moe_kind = MoeKind::topk_softmax_clamped;
  c.attention_sinks = true;
  for (auto [key, dst] : {std::pair{"swiglu_alpha", &c.swiglu_alpha}, std::pair{"swiglu_limit", &c.swiglu_limit}}) {
    *dst = r.number_or(key, *dst);
    if (!(*dst > 0) || !std::isfinite(*dst)) throw r.bad(key, str("must be a finite number > 0, got ", *dst));
  }
  // transformers' mxfp4 integration: the expert projections stored as `*_blocks` / `*_scales` load packed
  // (models/gpt_oss.hpp); the rest of the checkpoint is dense.
  const nlohmann::json& j = r.j;
  if (!r.has("quantization_config") || !j["quantization_config"].is_object() ||
      j["quantization_config"].value("quant_method", nlohmann::json()) != "mxfp4")
    return;
  c.mxfp4_experts = true;
  const nlohmann::json& q = j["quantization_config"];
  for (auto it = q.begin(); it != q.end(); ++it) {
    const std::string k = "quantization_config." + it.key();
    if (it.key() == "quant_method") continue;
    // Which modules transformers leaves unquantised. What the checkpoint stores dense is read as dense anyway:
    // an expert projection is packed exactly when its _blocks/_scales are there.
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
}

}  // namespace

const Family& gpt_oss_family() {
  static const Family f = [] {
    Family f;
    f.name = "gpt_oss";
    f.config_class = "GptOssConfig";
    f.summary = "gpt-oss MoE (attention sinks, alternating sliding/full layers, YaRN, biases, clamped GLU experts)";
    // With no rope keys at all, GptOssConfig's YaRN.
    f.defaults = {1e-5, 150000.0, 8, 64, false,
                  {{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                   {"truncate", false}, {"original_max_position_embeddings", 4096}}};
    f.reads_attention_bias = true;
    f.moe = true;
    f.experts_key = "num_local_experts";
    f.read = read_gpt_oss;
    f.presets = {{"tiny-gpt-oss", [](nlohmann::json& c) {
                    // As transformers 5 writes a GptOssConfig: alternating sliding/full layers (a window of 8, so
                    // the tests' sequences slide), YaRN as gpt-oss ships it (truncate false), biases everywhere,
                    // attention sinks.
                    c.update({{"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"}, {"intermediate_size", 32},
                              {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.9},
                              {"output_router_logits", false}, {"head_dim", 16}, {"rms_norm_eps", 1e-5},
                              {"tie_word_embeddings", false}, {"attention_bias", true}, {"sliding_window", 8},
                              {"layer_types", {"sliding_attention", "full_attention"}}, {"swiglu_alpha", 1.702},
                              {"swiglu_limit", 7.0},
                              {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 150000.0}, {"factor", 32.0},
                                                   {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"truncate", false},
                                                   {"original_max_position_embeddings", 64}}}});
                  }}};
    return f;
  }();
  return f;
}

}  // namespace ax::models
