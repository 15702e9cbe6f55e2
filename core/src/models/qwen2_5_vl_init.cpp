// `axengine init-model --preset tiny-qwen2_5-vl`: a tiny random Qwen2.5-VL that the mm_cpt plugin's data
// fits (real 14 x 14 patches, temporal 2, merge 2: pixel_values [N, 1176]), for the multimodal quickstart and
// the end-to-end training tests. Everything else is as small as the text presets: a 2-layer qwen2 decoder of
// hidden 64 with multimodal RoPE, a 2-block vision tower of hidden 32 (windows of 2 x 2 merge blocks, the
// second block full attention, so both paths run), and a preprocessor_config.json bounding images to 4..64
// merged tokens so a CPU step stays quick.
#include <cmath>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "atomic_dir.hpp"
#include "axengine/error.hpp"
#include "axengine/hf_tokenizer.hpp"
#include "axengine/log.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "models/decoder.hpp"
#include "models/qwen2_5_vl.hpp"

namespace ax::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The preprocessor's pixel bounds: 4 to 64 merged tokens per image (28 x 28 pixels each).
constexpr int64_t kMinPixels = 4 * 28 * 28, kMaxPixels = 64 * 28 * 28;

}  // namespace

VlPresetTokenizer make_vl_preset_tokenizer() {
  ByteLevelTokenizerOptions tok;
  // Qwen2-VL's vision tokens beside the text presets' specials: the mm_cpt dataset type splices them in.
  tok.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",  "<|pad|>",
                        "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"};
  tok.corpus = {"the quick brown fox jumps over the lazy dog", "hello world, hello axengine",
                "this picture shows a soft blob in red, green, blue, amber, teal, violet, grey or ochre",
                "first the image shows a wide gradient; then a diagonal wash or a bright spot, pixels wide",
                "0123456789 numbers and  spaces\n"};
  tok.num_merges = 60;
  VlPresetTokenizer out;
  out.tokenizer_json = make_byte_level_tokenizer_json(tok);
  out.tokenizer_config = make_byte_level_tokenizer_config_json(tok);
  out.tokenizer = parse_hf_tokenizer(out.tokenizer_json, "generated tokenizer.json", out.tokenizer_config);
  out.vocab = (out.tokenizer->vocab_size() + 63) / 64 * 64;  // padded like real embedding tables
  return out;
}

int64_t VlPresetTokenizer::id(const std::string& text) const {
  auto ids = tokenizer->encode(text, false);
  if (ids.size() != 1) throw RuntimeError(str("init-model: the generated tokenizer splits '", text, "'"));
  return ids[0];
}

nlohmann::json VlPresetTokenizer::token_ids() const {
  return {{"image_token_id", id("<|image_pad|>")}, {"video_token_id", id("<|video_pad|>")},
          {"vision_start_token_id", id("<|vision_start|>")}, {"vision_end_token_id", id("<|vision_end|>")}};
}

void write_vl_preset(const std::string& out_dir, uint64_t seed, const VlPresetTokenizer& tok, const VlPreset& p) {
  if (fs::exists(out_dir) && !fs::is_empty(out_dir))
    throw UsageError(str(out_dir, ": output directory exists and is not empty"));
  AtomicDir out(out_dir, "init_model");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // HF's _init_weights as tools.cpp applies it to the text presets: normal(0, 0.02), ones for norms, zero
  // biases, and unit-norm embedding rows so that a LoRA on the frozen random base can show its loss falling.
  auto add = [&](const std::string& name, const std::vector<int64_t>& shape) {
    at::Tensor t = at::empty(shape, at::kFloat);
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (bias) t.zero_();
    else if (name.find("norm") != std::string::npos || name.find("ln_q") != std::string::npos) t.fill_(1.0);
    else if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
      t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(p.text.hidden_size)), gen);
    else t.normal_(0.0, 0.02, gen);
    // transformers 5's module tree (model.language_model.*, model.visual.*) where the family's checkpoints use it.
    const bool v5 = p.module_tree_names;
    if (v5 && name.rfind("model.", 0) == 0) tensors.emplace_back("model.language_model." + name.substr(6), t);
    else if (v5 && name.rfind("visual.", 0) == 0) tensors.emplace_back("model." + name, t);
    else tensors.emplace_back(name, t);
  };
  for (const auto& [name, shape] : expected_checkpoint_tensors(p.text)) add(name, shape);
  for (const auto& [name, shape] : p.vision) add("visual." + name, shape);

  const fs::path d(out.path());
  const char* w = "init_model";
  safetensors::save((d / "model.safetensors").string(), tensors, {{"format", "pt"}}, w);
  safetensors::write_file_atomic((d / "config.json").string(), p.config.dump(2) + "\n", w);
  const json& text = p.config["text_config"];
  const json gen_cfg = {{"bos_token_id", text["bos_token_id"]}, {"eos_token_id", text["eos_token_id"]},
                        {"pad_token_id", text["pad_token_id"]}, {"_from_model_config", true}};
  safetensors::write_file_atomic((d / "generation_config.json").string(), gen_cfg.dump(2) + "\n", w);
  safetensors::write_file_atomic((d / "preprocessor_config.json").string(), p.preprocessor.dump(2) + "\n", w);
  safetensors::write_file_atomic((d / "tokenizer.json").string(), tok.tokenizer_json, w);
  safetensors::write_file_atomic((d / "tokenizer_config.json").string(), tok.tokenizer_config, w);
  out.commit();
  log::info(str("wrote ", p.name, " (vocab ", tok.vocab, ", ", p.vision.size(), " vision tensors) to ", out_dir));
}

json vl_preset_text_config(const VlPresetTokenizer& tok, const std::string& model_type) {
  const Tokenizer& t = *tok.tokenizer;
  return {{"model_type", model_type}, {"vocab_size", tok.vocab}, {"hidden_size", 64}, {"intermediate_size", 128},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"hidden_act", "silu"},
          {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6}, {"initializer_range", 0.02}, {"use_cache", true},
          {"attention_dropout", 0.0}, {"bos_token_id", t.bos_id() >= 0 ? json(t.bos_id()) : json(nullptr)},
          {"eos_token_id", t.eos_id()}, {"pad_token_id", t.pad_id()}};
}

void init_qwen2_5_vl_dir(const std::string& out_dir, uint64_t seed) {
  const VlPresetTokenizer tok = make_vl_preset_tokenizer();
  json text = vl_preset_text_config(tok, "qwen2_5_vl_text");
  text.update({{"use_sliding_window", false}, {"sliding_window", nullptr}, {"max_window_layers", 2},
               {"layer_types", {"full_attention", "full_attention"}},
               // head_dim 16: 8 frequencies, split 2 (time) / 3 (height) / 3 (width) as Qwen's 16/24/24 split 64.
               {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}, {"mrope_section", {2, 3, 3}}}}});
  const json vision = {
      {"model_type", "qwen2_5_vl_vision"}, {"depth", 2}, {"hidden_size", 32}, {"intermediate_size", 64},
      {"num_heads", 2}, {"out_hidden_size", 64}, {"in_channels", 3}, {"patch_size", 14}, {"temporal_patch_size", 2},
      {"spatial_merge_size", 2}, {"window_size", 56}, {"fullatt_block_indexes", {1}}, {"hidden_act", "silu"},
      {"initializer_range", 0.02}, {"tokens_per_second", 2},
      {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", 10000.0}}}};
  json cfg = {{"architectures", {"Qwen2_5_VLForConditionalGeneration"}}, {"model_type", "qwen2_5_vl"},
              {"dtype", "float32"}, {"tie_word_embeddings", true}, {"text_config", text}, {"vision_config", vision}};
  cfg.update(tok.token_ids());
  const VlConfig vl = parse_qwen2_5_vl_config(cfg, "tiny-qwen2_5-vl");  // the preset must load
  // As transformers 5 writes Qwen2VLImageProcessor's, with the bounds in both spellings it reads.
  const json pre = {{"image_processor_type", "Qwen2VLImageProcessor"}, {"do_resize", true}, {"do_rescale", true},
                    {"rescale_factor", 1.0 / 255}, {"do_normalize", true},
                    {"image_mean", {0.48145466, 0.4578275, 0.40821073}}, {"image_std", {0.26862954, 0.26130258, 0.27577711}},
                    {"do_convert_rgb", true}, {"min_pixels", kMinPixels}, {"max_pixels", kMaxPixels},
                    {"size", {{"shortest_edge", kMinPixels}, {"longest_edge", kMaxPixels}}}, {"patch_size", 14},
                    {"temporal_patch_size", 2}, {"merge_size", 2}};
  write_vl_preset(out_dir, seed, tok, {"tiny-qwen2_5-vl", cfg, pre, vl.text, vision_checkpoint_tensors(vl.vision), false});
}

}  // namespace ax::models
