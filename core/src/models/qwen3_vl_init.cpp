// `axengine init-model --preset tiny-qwen3-vl`: a tiny random Qwen3-VL that the mm_cpt plugin's data fits (real
// 16 x 16 patches, temporal 2, merge 2: pixel_values [N, 1536]; the processor's mean/std 0.5 as the hub's), for
// the quickstart and the end-to-end tests. The language model is the VL presets' 2-layer decoder with q/k norms
// and interleaved multimodal RoPE; the tower has 2 blocks of hidden 32, an 8 x 8 learned position grid and one
// deepstack feature (block 0's, added after decoder layer 0). Images are bounded to 4..64 merged tokens (32 x 32
// pixels each) so that a CPU step stays quick. Written in transformers 5's module tree, as the hub's are.
#include <nlohmann/json.hpp>

#include "axengine/strings.hpp"
#include "models/qwen3_vl.hpp"

namespace ax::models {
using nlohmann::json;

void init_qwen3_vl_variant_dir(const std::string& out_dir, uint64_t seed, const Qwen3VlPresetSpec& spec) {
  constexpr int64_t kMinPixels = 4 * 32 * 32, kMaxPixels = 64 * 32 * 32;
  const VlPresetTokenizer tok = make_vl_preset_tokenizer();
  json text = vl_preset_text_config(tok, spec.model_type + "_text");
  // head_dim 16: 8 frequencies, interleaved T H W T H W T T (mrope_section 4 / 2 / 2, as Qwen3-VL's 24 / 20 / 20 of 64).
  text.update({{"head_dim", 16}, {"attention_bias", false},
               {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5000000.0}, {"mrope_section", {4, 2, 2}},
                                    {"mrope_interleaved", true}}}});
  text.update(spec.text_keys);
  const json vision = {
      {"model_type", spec.model_type + "_vision"}, {"depth", 2}, {"hidden_size", 32}, {"intermediate_size", 64}, {"num_heads", 2},
      {"out_hidden_size", 64}, {"in_channels", 3}, {"patch_size", 16}, {"temporal_patch_size", 2}, {"spatial_merge_size", 2},
      {"num_position_embeddings", 64}, {"deepstack_visual_indexes", {0}}, {"hidden_act", "gelu_pytorch_tanh"},
      {"initializer_range", 0.02}, {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", 10000.0}}}};
  json cfg = {{"architectures", {spec.architecture}}, {"model_type", spec.model_type}, {"dtype", "float32"},
              {"tie_word_embeddings", true}, {"text_config", text}, {"vision_config", vision}};
  cfg.update(tok.token_ids());
  const Qwen3VlConfig vl = spec.parse(cfg, spec.preset);  // the preset must load
  // As the hub's Qwen3-VL preprocessor_config.json (Qwen2VLImageProcessor with patch 16 and mean / std 0.5).
  const json pre = {{"image_processor_type", "Qwen2VLImageProcessorFast"}, {"processor_class", "Qwen3VLProcessor"},
                    {"do_resize", true}, {"do_rescale", true}, {"rescale_factor", 1.0 / 255}, {"do_normalize", true},
                    {"image_mean", {0.5, 0.5, 0.5}}, {"image_std", {0.5, 0.5, 0.5}}, {"do_convert_rgb", true},
                    {"size", {{"shortest_edge", kMinPixels}, {"longest_edge", kMaxPixels}}}, {"patch_size", 16},
                    {"temporal_patch_size", 2}, {"merge_size", 2}};
  write_vl_preset(out_dir, seed, tok, {spec.preset, cfg, pre, vl.text, qwen3_vision_tensors(vl.vision), true});
}

void init_qwen3_vl_dir(const std::string& out_dir, uint64_t seed) {
  init_qwen3_vl_variant_dir(out_dir, seed, {"tiny-qwen3-vl", "qwen3_vl", "Qwen3VLForConditionalGeneration", json::object(),
                                            &parse_qwen3_vl_config});
}

}  // namespace ax::models
