// `axengine init-model --preset tiny-gemma3-mm`: a tiny random Gemma 3 multimodal model that chat_template rows
// with images train (the mm_cpt plugin's Gemma 3 processor): 56 x 56 images of 14-pixel patches (4 x 4) pooled to
// 4 soft tokens, a 2-layer SigLIP tower of hidden 32, a 2-layer gemma3_text decoder of hidden 64 (one sliding,
// one full layer), Gemma 3's chat template and a byte-level tokenizer holding Gemma's turn and image tokens.
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
#include "models/gemma3_mm.hpp"

namespace ax::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// google/gemma-3-4b-it's chat template (tests/data/chat_templates/google-gemma-3-it.jinja).
constexpr const char* kGemma3ChatTemplate = R"({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)";

int64_t gemma3_token_id(const Tokenizer& tok, const std::string& text) {
  auto ids = tok.encode(text, false);
  if (ids.size() != 1) throw RuntimeError(str("init-model: the generated tokenizer splits '", text, "'"));
  return ids[0];
}

}  // namespace

void init_gemma3_mm_dir(const std::string& out_dir, uint64_t seed) {
  ByteLevelTokenizerOptions tok;
  tok.special_tokens = {"<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                        "<image_soft_token>"};
  tok.bos_token = "<bos>";
  tok.eos_token = "<eos>";
  tok.pad_token = "<pad>";
  tok.corpus = {"the quick brown fox jumps over the lazy dog", "hello world, hello axengine",
                "this picture shows a soft blob in red, green, blue, amber, teal, violet, grey or ochre",
                "user model what is in the image? describe the colours", "0123456789 numbers and  spaces\n"};
  tok.num_merges = 60;
  const std::string tok_json = make_byte_level_tokenizer_json(tok);
  const std::string tok_cfg = make_byte_level_tokenizer_config_json(tok);
  auto tokenizer = parse_hf_tokenizer(tok_json, "generated tokenizer.json", tok_cfg);
  const int64_t vocab = (tokenizer->vocab_size() + 63) / 64 * 64;
  const json text = {
      {"model_type", "gemma3_text"}, {"vocab_size", vocab}, {"hidden_size", 64}, {"intermediate_size", 128},
      {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
      {"hidden_activation", "gelu_pytorch_tanh"}, {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6},
      {"query_pre_attn_scalar", 16}, {"sliding_window", 64}, {"layer_types", {"sliding_attention", "full_attention"}},
      {"attn_logit_softcapping", nullptr}, {"final_logit_softcapping", nullptr}, {"attention_bias", false},
      {"bos_token_id", tokenizer->bos_id()}, {"eos_token_id", tokenizer->eos_id()}, {"pad_token_id", tokenizer->pad_id()},
      {"rope_parameters", {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}}};
  const json vision = {{"model_type", "siglip_vision_model"}, {"hidden_size", 32}, {"intermediate_size", 64},
                       {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_channels", 3}, {"image_size", 56},
                       {"patch_size", 14}, {"hidden_act", "gelu_pytorch_tanh"}, {"layer_norm_eps", 1e-6},
                       {"vision_use_head", false}};
  const json cfg = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"}, {"dtype", "float32"},
                    {"tie_word_embeddings", true}, {"text_config", text}, {"vision_config", vision}, {"mm_tokens_per_image", 4},
                    {"image_token_index", gemma3_token_id(*tokenizer, "<image_soft_token>")},
                    {"boi_token_index", gemma3_token_id(*tokenizer, "<start_of_image>")},
                    {"eoi_token_index", gemma3_token_id(*tokenizer, "<end_of_image>")}};
  const Gemma3MmConfig mm = parse_gemma3_mm_config(cfg, "tiny-gemma3-mm");  // the preset must load

  if (fs::exists(out_dir) && !fs::is_empty(out_dir)) throw UsageError(str(out_dir, ": output directory exists and is not empty"));
  AtomicDir out(out_dir, "init_model");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  // As the other presets: normal(0, 0.02), zero (1 + w) RMSNorm weights in the decoder and projector (unit scale),
  // LayerNorms at 1, zero biases, unit-norm embedding rows.
  for (auto [name, shape] : expected_checkpoint_tensors(mm.text)) {
    at::Tensor t = at::empty(shape, at::kFloat);
    if (name.find("norm") != std::string::npos) t.zero_();
    else if (name == "model.embed_tokens.weight") t.normal_(0.0, 1.0 / std::sqrt(double(mm.text.hidden_size)), gen);
    else t.normal_(0.0, 0.02, gen);
    tensors.emplace_back("language_model." + name, t);
  }
  for (const auto& [name, shape] : gemma3_vision_tensors(mm)) {
    at::Tensor t = at::empty(shape, at::kFloat);
    if (name.find("mm_soft_emb_norm") != std::string::npos || name.ends_with(".bias")) t.zero_();
    else if (name.find("layer_norm") != std::string::npos || name.find("post_layernorm") != std::string::npos) t.fill_(1.0);
    else t.normal_(0.0, 0.02, gen);
    tensors.emplace_back(name, t);
  }
  const fs::path d(out.path());
  const char* w = "init_model";
  safetensors::save((d / "model.safetensors").string(), tensors, {{"format", "pt"}}, w);
  safetensors::write_file_atomic((d / "config.json").string(), cfg.dump(2) + "\n", w);
  const json gen_cfg = {{"bos_token_id", text["bos_token_id"]}, {"eos_token_id", text["eos_token_id"]},
                        {"pad_token_id", text["pad_token_id"]}, {"_from_model_config", true}};
  safetensors::write_file_atomic((d / "generation_config.json").string(), gen_cfg.dump(2) + "\n", w);
  const json pre = {{"image_processor_type", "Gemma3ImageProcessor"}, {"do_resize", true}, {"size", {{"height", 56}, {"width", 56}}},
                    {"resample", 2}, {"do_rescale", true}, {"rescale_factor", 1.0 / 255}, {"do_normalize", true},
                    {"image_mean", {0.5, 0.5, 0.5}}, {"image_std", {0.5, 0.5, 0.5}}, {"do_convert_rgb", true},
                    {"do_pan_and_scan", false}};
  safetensors::write_file_atomic((d / "preprocessor_config.json").string(), pre.dump(2) + "\n", w);
  safetensors::write_file_atomic((d / "tokenizer.json").string(), tok_json, w);
  safetensors::write_file_atomic((d / "tokenizer_config.json").string(), tok_cfg, w);
  safetensors::write_file_atomic((d / "chat_template.jinja").string(), kGemma3ChatTemplate, w);
  out.commit();
  log::info(str("wrote tiny-gemma3-mm (gemma3, vocab ", vocab, ", vision ", mm.vision.num_layers, " layers, ", mm.mm_tokens_per_image,
                " tokens per image) to ", out_dir));
}

}  // namespace ax::models
