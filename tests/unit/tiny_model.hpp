// A tiny Llama directory for CLI-level trainer tests (until then-independent of `init-model`): HF config,
// randomly initialised weights (N(0, 0.02), norms at 1) and a byte-level tokenizer.json.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "axengine/hf_tokenizer.hpp"
#include "axengine/safetensors.hpp"

namespace ax::test {

inline void make_tiny_llama(const std::filesystem::path& dir, int64_t hidden = 64, int64_t layers = 2) {
  std::filesystem::create_directories(dir);
  ByteLevelTokenizerOptions tok;
  const int64_t vocab = 256 + static_cast<int64_t>(tok.special_tokens.size());
  {
    std::ofstream(dir / "tokenizer.json") << make_byte_level_tokenizer_json(tok);
    std::ofstream(dir / "tokenizer_config.json") << make_byte_level_tokenizer_config_json(tok);
  }
  const int64_t inter = hidden * 2, heads = 4, kv = 2, hd = hidden / heads;
  std::ofstream(dir / "config.json")
      << "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": " << vocab
      << ", \"hidden_size\": " << hidden << ", \"intermediate_size\": " << inter << ", \"num_hidden_layers\": " << layers
      << ", \"num_attention_heads\": " << heads << ", \"num_key_value_heads\": " << kv << ", \"head_dim\": " << hd
      << ", \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\""
      << ", \"tie_word_embeddings\": false, \"bos_token_id\": null, \"eos_token_id\": 256, \"pad_token_id\": 259"
      << ", \"torch_dtype\": \"float32\"}\n";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  std::vector<std::pair<std::string, at::Tensor>> w;
  auto rnd = [&](const std::string& n, std::vector<int64_t> shape) { w.emplace_back(n, at::randn(shape, gen, at::kFloat) * 0.02); };
  rnd("model.embed_tokens.weight", {vocab, hidden});
  for (int64_t l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    w.emplace_back(p + "input_layernorm.weight", at::ones({hidden}));
    w.emplace_back(p + "post_attention_layernorm.weight", at::ones({hidden}));
    rnd(p + "self_attn.q_proj.weight", {heads * hd, hidden});
    rnd(p + "self_attn.k_proj.weight", {kv * hd, hidden});
    rnd(p + "self_attn.v_proj.weight", {kv * hd, hidden});
    rnd(p + "self_attn.o_proj.weight", {hidden, heads * hd});
    rnd(p + "mlp.gate_proj.weight", {inter, hidden});
    rnd(p + "mlp.up_proj.weight", {inter, hidden});
    rnd(p + "mlp.down_proj.weight", {hidden, inter});
  }
  w.emplace_back("model.norm.weight", at::ones({hidden}));
  rnd("lm_head.weight", {vocab, hidden});
  safetensors::save((dir / "model.safetensors").string(), w);
}

}  // namespace ax::test
