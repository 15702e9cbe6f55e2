// Qwen3-VL-MoE (model_type "qwen3_vl_moe", Qwen3VLMoeForConditionalGeneration, e.g. Qwen3-VL-30B-A3B): Qwen3-VL's
// model (models/qwen3_vl_model.cpp: tower, deepstack, interleaved mrope) over a qwen3_moe decoder, after
// transformers 5.23's modeling_qwen3_vl_moe.py and configuration_qwen3_vl_moe.py:
//   - Qwen3VLMoeTextConfig's defaults for what text_config leaves out (below);
//   - Qwen3VLMoeTextTopKRouter: softmax → top-k, the k weights always renormalised (norm_topk_prob is not read);
//   - sparse layers as Qwen3VLMoeTextDecoderLayer picks them: not in mlp_only_layers and (i + 1) %
//     decoder_sparse_step == 0; the others a SiLU GLU of intermediate_size;
//   - the fused experts stored transposed in the checkpoints (models/decoder_checkpoint.cpp reads them);
//   - LoRA: peft converts no target on this model (its MoE conversion has no qwen3_vl_moe), so the experts are
//     targeted by their parameters (gate_up_proj, experts.down_proj: peft's target_parameters), gate_proj /
//     up_proj / down_proj name the dense layers' MLP (mlp_only_layers).
#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "models/qwen3_vl.hpp"

namespace ax::models {
using nlohmann::json;

namespace {

const Qwen3VlTextClass& moe_text_class() {
  // head_dim null: hidden_size / num_attention_heads (the class's __post_init__). The expert count is left to
  // qwen3_vl_moe_config below: the class writes it as num_local_experts (its attribute_map).
  static const Qwen3VlTextClass cls{
      "qwen3_vl_moe", "qwen3_moe",
      {{"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5632}, {"num_hidden_layers", 24},
       {"num_attention_heads", 16}, {"num_key_value_heads", 16}, {"head_dim", nullptr}, {"rms_norm_eps", 1e-6},
       {"max_position_embeddings", 128000}, {"rope_theta", 500000.0}, {"attention_bias", false}, {"hidden_act", "silu"},
       {"decoder_sparse_step", 1}, {"moe_intermediate_size", 1408}, {"num_experts_per_tok", 4},
       {"router_aux_loss_coef", 0.001}, {"output_router_logits", false}, {"mlp_only_layers", json::array()}}};
  return cls;
}

}  // namespace

Qwen3VlConfig parse_qwen3_vl_moe_config(const json& j, const std::string& source) {
  json k = j;
  if (k.is_object() && (!k.contains("text_config") || k["text_config"].is_null())) k["text_config"] = json::object();
  if (k.is_object() && k["text_config"].is_object()) {
    json& t = k["text_config"];
    auto given = [&](const char* key) { return t.contains(key) && !t[key].is_null(); };
    if (!given("num_experts") && !given("num_local_experts")) t["num_local_experts"] = 60;
    // The router renormalises whatever the key says; qwen3_moe's reader would read it (default false).
    t.erase("norm_topk_prob");
  }
  Qwen3VlConfig c = parse_qwen3_vl_config(k, source, moe_text_class());
  c.text.norm_topk_prob = true;
  return c;
}

// qwen3_vl's checkpoint layout, tower and refusals; LoRA planned under "qwen3_vl_moe", a name no decoder family of
// ours converts expert targets for (as peft converts none here): gate_up_proj / experts.down_proj name the experts.
const VlDescription& qwen3_vl_moe_description() {
  static const VlDescription d = [] {
    VlDescription m = qwen3_vl_description();
    m.family = m.lora_family = "qwen3_vl_moe";
    m.inspect = [](const json& cfg, const std::string& source) {
      return qwen3_vl_inspect(parse_qwen3_vl_moe_config(cfg, source), "qwen3_vl_moe (language model qwen3_moe)");
    };
    m.preset = "tiny-qwen3-vl-moe";
    m.init_preset = init_qwen3_vl_moe_dir;
    return m;
  }();
  return d;
}

void register_qwen3_vl_moe(Registry& registry) {
  register_qwen3_vl_variant(registry, {&qwen3_vl_moe_description, "Qwen3-VL-MoE (Qwen3-VL's vision tower and deepstack, qwen3_moe decoder "
                                       "with interleaved multimodal RoPE)", &parse_qwen3_vl_moe_config});
}

void init_qwen3_vl_moe_dir(const std::string& out_dir, uint64_t seed) {
  // 4 experts of 48 (2I = 96 is not the hidden 64: the stored [E, H, 2I] is told from [E, 2I, H] by its shape, as
  // transformers tells it), top 2; layer 1 dense through mlp_only_layers, with the presets' intermediate 128.
  const json moe = {{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 48}, {"decoder_sparse_step", 1},
                    {"mlp_only_layers", {1}}, {"router_aux_loss_coef", 0.001}, {"output_router_logits", false}};
  init_qwen3_vl_variant_dir(out_dir, seed, {"tiny-qwen3-vl-moe", "qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", moe,
                                            &parse_qwen3_vl_moe_config});
}

}  // namespace ax::models
