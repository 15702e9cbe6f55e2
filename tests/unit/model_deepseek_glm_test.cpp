// glm4_moe and deepseek_v3 beyond their parity cases in model_parity_test.cpp (tests/data/models/{glm4_moe,
// glm4_moe_qknorm, deepseek_v3, deepseek_v3_qproj}, scripts/goldens/make_deepseek_glm_goldens.py): packed rows give
// the logits and loss of separate rows (MLA's latent and the router see one sample at a time), merge-lora gives
// transformers+peft's logits and writes the checkpoint's own names (fp32 correction bias included), the fused
// expert form loads like the per-expert one, the init-model presets load and train (bf16, nf4 too), and the config /
// checkpoint refusals.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/strings.hpp"
#include "axengine/selection.hpp"
#include "models/decoder.hpp"
#include "models/layer_bytes.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_hybrid_checks.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

const char* kCases[] = {"glm4_moe", "glm4_moe_qknorm", "deepseek_v3", "deepseek_v3_qproj"};

std::unique_ptr<ax::Model> load(const ax::Registry& reg, const fs::path& dir, const fs::path& adapter = {},
                                const std::string& dtype = "fp32") {
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.dtype = dtype;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  if (!adapter.empty()) o.adapter_dir = adapter.string();
  return ax::load_model(reg, o);
}

using ax::test::rel_max;

std::string load_error(const ax::Registry& reg, const fs::path& dir) {
  try {
    load(reg, dir);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("deepseek_v3 / glm4_moe: two samples packed in one row give their own rows' logits and loss") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string name : kCases) {
    CAPTURE(name);
    auto model = load(reg, ax::test::case_dir(name), ax::test::case_dir(name) / "adapter");
    ax::test::check_packed_golden(*model, ax::test::case_dir(name));
  }
}

TEST_CASE("deepseek_v3 / glm4_moe: merge-lora gives transformers+peft's logits in the checkpoint's own layout") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string name : kCases) {
    CAPTURE(name);
    const fs::path base = ax::test::case_dir(name);
    const fs::path out = ax::test::scratch_dir("merge_" + name) / "merged";
    ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "bf16");
    auto merged = ax::safetensors::Checkpoint::open_dir(out.string());
    auto orig = ax::safetensors::Checkpoint::open_dir(base.string());
    CHECK(merged.names() == orig.names());  // per-expert keys, shared experts, the correction bias
    for (const auto& n : orig.names()) {
      CAPTURE(n);
      CHECK(merged.info(n).shape == orig.info(n).shape);
      // The correction bias stays fp32 (transformers keeps it so), and exactly the stored values.
      if (n.find("e_score_correction_bias") != std::string::npos) CHECK(at::equal(merged.get(n), orig.get(n)));
    }
    ax::test::remove_tree(out);
    ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "fp32");
    auto golden = ax::safetensors::File::open((base / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = golden->get("input_ids");
    CHECK(rel_max(load(reg, out)->forward(b, true).logits, golden->get("logits")) <= 1e-4);
    ax::test::remove_tree(out.parent_path());
  }
}

TEST_CASE("deepseek_v3 / glm4_moe: fused experts (transformers 5's in-memory form) load like the per-expert checkpoint") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string name : {"glm4_moe", "deepseek_v3"}) {
    CAPTURE(name);
    const fs::path src = ax::test::case_dir(name);
    auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
    const auto cfg = ax::models::parse_hf_config(ax::test::config_of(name), name);
    std::vector<std::pair<std::string, at::Tensor>> fused;
    for (const auto& n : ckpt.names())
      if (n.find(".mlp.experts.") == std::string::npos) fused.emplace_back(n, ckpt.get(n));
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      if (!cfg.is_moe_layer(i)) continue;
      const std::string p = ax::str("model.layers.", i, ".mlp.experts.");
      std::vector<at::Tensor> gate_up, down;
      for (int64_t e = 0; e < cfg.num_experts; ++e) {
        const std::string x = ax::str(p, e, ".");
        gate_up.push_back(at::cat({ckpt.get(x + "gate_proj.weight"), ckpt.get(x + "up_proj.weight")}, 0));
        down.push_back(ckpt.get(x + "down_proj.weight"));
      }
      fused.emplace_back(p + "gate_up_proj", at::stack(gate_up));
      fused.emplace_back(p + "down_proj", at::stack(down));
    }
    const fs::path dir = ax::test::scratch_dir("fused_" + name);
    fs::copy_file(src / "config.json", dir / "config.json");
    ax::safetensors::save((dir / "model.safetensors").string(), fused);
    auto golden = ax::safetensors::File::open((src / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = golden->get("input_ids");
    CHECK(rel_max(load(reg, dir, src / "adapter")->forward(b, true).logits, golden->get("logits")) <= 1e-4);
    ax::test::remove_tree(dir);
  }
}

TEST_CASE("deepseek_v3 / glm4_moe: init-model presets load, train a step and take an adapter") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string preset : {"tiny-glm4-moe", "tiny-deepseek-v3"}) {
    CAPTURE(preset);
    const fs::path dir = ax::test::scratch_dir("init_" + preset);
    ax::init_model_dir(preset, dir.string(), 3);
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    ax::LoraSpec spec;
    spec.targets = preset == "tiny-deepseek-v3"
                       ? std::vector<std::string>{"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
                       : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    o.lora = spec;
    auto m = ax::load_model(reg, o);
    ax::Batch b;
    b.input_ids = at::randint(0, 100, {2, 9}, at::kLong);
    b.labels = b.input_ids.clone();
    auto out = m->forward(b, false);
    REQUIRE(std::isfinite(out.loss.item<double>()));
    out.loss.backward();
    int with_grad = 0;
    for (auto& [n, t] : m->trainable_parameters()) with_grad += t.grad().defined();
    CHECK(with_grad == static_cast<int>(m->trainable_parameters().size()));
    ax::test::remove_tree(dir);
  }
}

TEST_CASE("deepseek_v3 / glm4_moe: inconsistent router and attention keys are refused naming the key") {
  const nlohmann::json ds = ax::test::config_of("deepseek_v3"), glm = ax::test::config_of("glm4_moe");
  auto with = [](nlohmann::json j, const char* key, const nlohmann::json& v) {
    j[key] = v;
    return ax::test::parse_error(j);
  };
  CHECK(ax::test::parse_error(ds) == "");
  CHECK(ax::test::parse_error(glm) == "");
  // 8 experts: n_group 3 does not divide them; topk_group above n_group; more experts per token than the kept
  // groups hold; groups of one expert (scored by their best two).
  CHECK(with(ds, "n_group", 3).find("n_group: 3 does not divide n_routed_experts 8") != std::string::npos);
  CHECK(with(ds, "topk_group", 5).find("topk_group: must be in [1, n_group = 4], got 5") != std::string::npos);
  CHECK(with(ds, "num_experts_per_tok", 5).find("num_experts_per_tok: must be in [1, 4]") != std::string::npos);
  CHECK(with(ds, "n_group", 8).find("fewer than 2 per group") != std::string::npos);
  CHECK(with(glm, "n_routed_experts", 7).find("does not divide n_routed_experts 7") != std::string::npos);
  CHECK(with(glm, "routed_scaling_factor", 0).find("'routed_scaling_factor' must be a finite number > 0") != std::string::npos);
  CHECK(with(glm, "first_k_dense_replace", -1).find("'first_k_dense_replace' must be >= 0") != std::string::npos);
  CHECK(with(glm, "n_shared_experts", 0).find("'n_shared_experts' must be positive") != std::string::npos);
  // MLA: a latent rank the class cannot build, heads of k/v other than the query heads, an odd rope dim.
  CHECK(with(ds, "kv_lora_rank", nullptr).find("'kv_lora_rank' must be a positive integer") != std::string::npos);
  CHECK(with(ds, "v_head_dim", nullptr).find("'v_head_dim' must be a positive integer") != std::string::npos);
  CHECK(with(ds, "num_key_value_heads", 1).find("'num_key_value_heads' 1 must equal num_attention_heads 3") != std::string::npos);
  CHECK(with(ds, "qk_rope_head_dim", 5).find("'qk_rope_head_dim' must be even") != std::string::npos);
  // GLM's partial rotary must leave an even rotary dim.
  nlohmann::json j = glm;
  j["rope_parameters"]["partial_rotary_factor"] = 0.125;  // 1 of head_dim 8
  CHECK(ax::test::parse_error(j).find("gives the rotary dim 1") != std::string::npos);
  // What the parser derives: the dense first layer, the shared experts' size, the rope dims as head_dim, the
  // softmax scale with YaRN's mscale_all_dim (transformers: 10^-1/2 · (0.1 · 0.8 · ln 40 + 1)^2).
  const auto c = ax::models::parse_hf_config(ds, "c.json");
  CHECK_FALSE(c.is_moe_layer(0));
  CHECK(c.is_moe_layer(1));
  CHECK(c.shared_expert_intermediate_size == 6);
  CHECK(c.head_dim == 4);
  const double m = 0.1 * 0.8 * std::log(40.0) + 1.0;
  CHECK(c.mla.softmax_scale == doctest::Approx(m * m / std::sqrt(10.0)).epsilon(1e-12));
  nlohmann::json null_q = ds;
  null_q["q_lora_rank"] = nullptr;
  CHECK(ax::models::parse_hf_config(null_q, "c.json").mla.q_lora_rank == 0);
}

TEST_CASE("deepseek_v3 / glm4_moe: a checkpoint missing a tensor, or with one of another shape, is refused naming it") {
  ax::Registry reg;
  ax::register_builtins(reg);
  struct Drop {
    const char* name;
    const char* tensor;
  };
  for (const Drop d : {Drop{"deepseek_v3", "model.layers.1.self_attn.kv_a_layernorm.weight"},
                       Drop{"deepseek_v3", "model.layers.2.mlp.gate.e_score_correction_bias"},
                       Drop{"glm4_moe", "model.layers.1.mlp.shared_experts.up_proj.weight"},
                       Drop{"glm4_moe", "model.layers.2.mlp.experts.5.down_proj.weight"}}) {
    CAPTURE(d.tensor);
    const fs::path src = ax::test::case_dir(d.name);
    auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
    std::vector<std::pair<std::string, at::Tensor>> kept;
    for (const auto& n : ckpt.names())
      if (n != d.tensor) kept.emplace_back(n, ckpt.get(n));
    const fs::path dir = ax::test::scratch_dir("missing_dsglm");
    fs::copy_file(src / "config.json", dir / "config.json");
    ax::safetensors::save((dir / "model.safetensors").string(), kept);
    CHECK(load_error(reg, dir).find(d.tensor) != std::string::npos);
    ax::test::remove_tree(dir);
  }
  // A config whose latent rank is not the checkpoint's (given, or left to the class default 512), or that says
  // q_lora_rank over a checkpoint with a plain q_proj: the key and the tensor are named.
  nlohmann::json cfg = ax::test::config_of("deepseek_v3");
  cfg["kv_lora_rank"] = 9;
  {
    ax::test::EditedModel edited("deepseek_v3", cfg, "dsglm_kv_rank");
    CHECK(load_error(reg, edited.dir).find("'kv_lora_rank' + 'qk_rope_head_dim' is 9 + 4 = 13 but") != std::string::npos);
  }
  cfg.erase("kv_lora_rank");
  {
    ax::test::EditedModel edited("deepseek_v3", cfg, "dsglm_kv_rank");
    const std::string err = load_error(reg, edited.dir);
    CHECK(err.find("is 512 + 4 = 516 but") != std::string::npos);
    CHECK(err.find("kv_a_proj_with_mqa.weight' has 12 rows") != std::string::npos);
  }
  cfg = ax::test::config_of("deepseek_v3_qproj");
  cfg["q_lora_rank"] = 4;
  ax::test::EditedModel edited("deepseek_v3_qproj", cfg, "dsglm_q_rank");
  CHECK(load_error(reg, edited.dir).find("'q_lora_rank' is 4 but") != std::string::npos);
}

TEST_CASE("deepseek_v3 / glm4_moe: in bf16 the router's correction bias stays fp32, and the model tracks its fp32 golden") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string name : {"glm4_moe", "deepseek_v3"}) {
    CAPTURE(name);
    auto m = load(reg, ax::test::case_dir(name), ax::test::case_dir(name) / "adapter", "bf16");
    int biases = 0;
    for (const auto& [n, t] : m->named_parameters()) {
      if (n.find("e_score_correction_bias") == std::string::npos) continue;
      CHECK(bool(t.scalar_type() == at::kFloat));
      ++biases;
    }
    CHECK(biases == 2);
    auto golden = ax::safetensors::File::open((ax::test::case_dir(name) / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = golden->get("input_ids");
    // bf16 rounding (8 bits of mantissa) through 3 layers; a wrong router or attention is off by O(1).
    CHECK(rel_max(m->forward(b, true).logits.to(at::kFloat), golden->get("logits")) <= 0.1);
  }
}

TEST_CASE("deepseek_v3 / glm4_moe: QLoRA packs MLA's, the experts' and the shared experts' projections to nf4") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string preset : {"tiny-deepseek-v3", "tiny-glm4-moe"}) {
    CAPTURE(preset);
    const fs::path dir = ax::test::scratch_dir("nf4_" + preset);
    ax::init_model_dir(preset, dir.string(), 5);
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    auto dense = ax::load_model(reg, o);
    o.weights.format = "nf4";
    auto packed = ax::load_model(reg, o);
    const auto st = packed->weight_stats();
    CHECK(st.kept.empty());  // every projection fits blocksize 64: none left dense
    // Everything but the embeddings, the head, norms, routers, their correction biases and GLM's q/k/v biases.
    int64_t other = 0;
    for (const auto& [n, t] : dense->named_parameters())
      if (n.find("proj") == std::string::npos || n.find(".bias") != std::string::npos) other += t.numel();
    CHECK(st.packed_params == st.params - other);
    ax::Batch b;
    b.input_ids = at::randint(0, 300, {2, 9}, at::kLong);
    const at::Tensor want = dense->forward(b, true).logits, got = packed->forward(b, true).logits;
    const double err = rel_max(got, want);
    CHECK(err > 0);     // the packed base is what ran
    CHECK(err < 0.05);  // nf4 rounding of a random base, not another model
    ax::test::remove_tree(dir);
  }
}

TEST_CASE("deepseek_v3: Kimi K2's model_type kimi_k2 is read as deepseek_v3") {
  nlohmann::json j = ax::test::config_of("deepseek_v3");
  j["model_type"] = "kimi_k2";
  const auto c = ax::models::parse_hf_config(j, "c.json");
  CHECK(c.model_type == "deepseek_v3");
  CHECK(c.is_mla());
}

// The hub's config.json files as they ship (transformers 4 spelling, remote-code keys transformers' classes ignore:
// topk_method, scoring_func, moe_layer_freq, ...): read without a complaint, with the sizes the checkpoints have.
TEST_CASE("deepseek_v3 / glm4_moe: the hub configs of DeepSeek-V3 (bf16) and GLM-4.5-Air read as their checkpoints are") {
  const nlohmann::json ds = nlohmann::json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
  const auto c = ax::models::parse_hf_config(ds, "DeepSeek-V3/config.json");
  CHECK(c.mla.q_lora_rank == 1536);
  CHECK(c.head_dim == 64);
  CHECK(c.rope.type == "yarn");
  CHECK(c.rope.attention_factor == doctest::Approx(1.0));  // mscale == mscale_all_dim
  const double m = 0.1 * std::log(40.0) + 1.0;
  CHECK(c.mla.softmax_scale == doctest::Approx(m * m / std::sqrt(192.0)).epsilon(1e-12));
  CHECK(c.mlp_only_layers == std::vector<int64_t>{0, 1, 2});
  CHECK(c.n_group == 8);
  CHECK(c.topk_group == 4);
  CHECK(c.shared_expert_intermediate_size == 2048);
  CHECK(c.routed_scaling_factor == 2.5);
  const nlohmann::json glm = nlohmann::json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0, "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
    "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": true, "num_attention_heads": 96,
    "n_group": 1, "topk_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
    "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.54.0", "use_cache": true,
    "use_qk_norm": false, "vocab_size": 151552})");
  const auto g = ax::models::parse_hf_config(glm, "GLM-4.5-Air/config.json");
  CHECK(g.head_dim == 128);
  CHECK(g.rope_dim() == 64);
  CHECK(g.qkv_bias);
  CHECK_FALSE(g.o_bias);
  CHECK_FALSE(g.qk_norm);
  CHECK(g.num_experts == 128);
  CHECK(g.mlp_only_layers == std::vector<int64_t>{0});
  CHECK(g.shared_expert_intermediate_size == 1408);
}

TEST_CASE("deepseek_v3: decode with kv_b_proj absorbed gives the expanding decode's logits and greedy tokens") {
  // Both MLA cases with their adapters (LoRA on kv_b_proj: the absorbed matrices carry it), three rows: prefills
  // of 5, 1 and 3, a turn of 3 appended to row 2 (several queries over the cache), then greedy steps.
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string name : {"deepseek_v3", "deepseek_v3_qproj"}) {
    CAPTURE(name);
    auto m = load(reg, ax::test::case_dir(name), ax::test::case_dir(name) / "adapter");
    auto& dec = dynamic_cast<ax::models::DecoderModel&>(*m);
    REQUIRE(dec.lora().find("model.layers.0.self_attn.kv_b_proj") != nullptr);
    auto run = [&](bool absorb) {
      dec.set_mla_absorb(absorb);
      auto cache = dec.new_cache(3, 24);
      std::vector<at::Tensor> steps{dec.decode({{3, 9, 1, 4, 7}, {5}, {8, 0, 6}}, *cache)};
      steps.push_back(dec.decode({{}, {}, {2, 2, 7}}, *cache));
      for (int s = 0; s < 10; ++s) {
        const at::Tensor next = steps.back().argmax(-1);
        steps.push_back(dec.decode({{next[0].item<int64_t>()}, {next[1].item<int64_t>()}, {next[2].item<int64_t>()}}, *cache));
      }
      return steps;
    };
    const auto absorbed = run(true), expanded = run(false);
    dec.set_mla_absorb(true);
    for (std::size_t s = 0; s < absorbed.size(); ++s) {
      CAPTURE(s);
      CHECK(rel_max(absorbed[s], expanded[s]) <= 1e-5);
      CHECK(at::equal(absorbed[s].argmax(-1), expanded[s].argmax(-1)));
    }
  }
}

// bf16 (compute dtype; fp32 LoRA factors, router and correction bias) on the CPU against the fp32 transformers
// goldens, the measures of model_cuda_test.cpp: logits max |diff| / max(1, max |logit|), loss relative, LoRA
// grads norm-relative (worst factor). Measured 2026-12-07 (ours / transformers 5.23 + peft 0.21.2's own bf16
// run of the same case, scripts/goldens/measure_deepseek_glm_bf16.py):
//   glm4_moe          logits 0.029 / 0.019   loss 0.0002 / 0.0003   grads 0.048 / 0.048
//   glm4_moe_qknorm   logits 0.036 / 0.032   loss 0.0007 / 0.0020   grads 0.077 / 0.096
//   deepseek_v3       logits 0.059 / 0.074   loss 0.0018 / 0.0003   grads 0.247 / 0.337 (kv_b_proj lora_A)
//   deepseek_v3_qproj logits 0.036 / 0.043   loss 0.0008 / 0.0011   grads 0.048 / 0.055
// deepseek_v3 is the YaRN case (factor 40, mscale_all_dim 0.8): the rope dims carry cos/sin scaled by the attention
// factor and rounded to bf16, and the softmax scale is mscale² larger, so bf16 moves it more, in transformers too.
// The tolerances: the other families' (5% logits, 2% loss, 10% grads), and for deepseek_v3 8% / 2% / 35%.
namespace {
struct Bf16Tol {
  double logits, loss, grads;
};
Bf16Tol bf16_tol(const std::string& name) { return name == "deepseek_v3" ? Bf16Tol{8e-2, 2e-2, 3.5e-1} : Bf16Tol{5e-2, 2e-2, 1e-1}; }
}  // namespace

TEST_CASE("deepseek_v3 / glm4_moe: bf16 on the CPU within the documented tolerances of the fp32 goldens") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const std::string name : kCases) {
    CAPTURE(name);
    auto m = load(reg, ax::test::case_dir(name), ax::test::case_dir(name) / "adapter", "bf16");
    auto g = ax::safetensors::File::open((ax::test::case_dir(name) / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    b.labels = g->get("labels");
    auto out = m->forward(b, true);
    const at::Tensor want = g->get("logits");
    const double logit_err = (out.logits.to(at::kFloat) - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
    const double want_loss = g->get("loss").item<double>();
    const double loss_err = std::abs(out.loss.item<double>() - want_loss) / std::abs(want_loss);
    out.loss.backward();
    double grad_err = 0;
    for (const auto& mod : dynamic_cast<ax::models::DecoderModel&>(*m).lora().modules) {
      at::Tensor ga = mod.a.grad().to(at::kFloat), gb = mod.b.grad().to(at::kFloat);
      if (mod.site.experts) gb = gb.view({gb.size(0), mod.site.num_experts, mod.r}).permute({0, 2, 1}).reshape({gb.size(0), -1});
      const at::Tensor wa = g->get("grad." + mod.peft_key + ".lora_A.weight"), wb = g->get("grad." + mod.peft_key + ".lora_B.weight");
      grad_err = std::max({grad_err, (ga - wa).norm().item<double>() / wa.norm().item<double>(),
                           (gb - wb).norm().item<double>() / wb.norm().item<double>()});
    }
    MESSAGE(name << ": bf16 logits " << logit_err << ", loss " << loss_err << ", LoRA grads " << grad_err);
    const Bf16Tol tol = bf16_tol(name);
    CHECK(logit_err <= tol.logits);
    CHECK(loss_err <= tol.loss);
    CHECK(grad_err <= tol.grads);
    CHECK(grad_err > 0);  // the bf16 model is what ran
  }
}

TEST_CASE("deepseek_v3: inspect reports a DeepSeek-V3-shaped layer's bytes per parameter with dense, nf4 and mxfp4 experts") {
  // DeepSeek-V3's sizes (hub config.json), 4 layers: the first sparse one is layer 3 (first_k_dense_replace).
  nlohmann::json j = ax::test::config_of("deepseek_v3");
  j.update({{"hidden_size", 7168}, {"num_attention_heads", 128}, {"num_key_value_heads", 128}, {"q_lora_rank", 1536},
            {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
            {"n_routed_experts", 256}, {"num_experts_per_tok", 8}, {"n_group", 8}, {"topk_group", 4},
            {"moe_intermediate_size", 2048}, {"intermediate_size", 18432}, {"n_shared_experts", 1},
            {"first_k_dense_replace", 3}, {"num_hidden_layers", 4}, {"vocab_size", 129280}});
  const auto c = ax::models::parse_hf_config(j, "DeepSeek-V3/config.json");
  const auto b = ax::models::moe_layer_bytes(c);
  CHECK(b.layer == 3);
  // 256 routed + 1 shared expert of 3 x 2048 x 7168; MLA (q_a, q_a norm, q_b, kv_a, kv_a norm, kv_b, o), the two
  // layer norms, the router and its correction bias.
  const int64_t H = 7168, experts = 257LL * 3 * 2048 * H;
  const int64_t mla = 1536 * H + 1536 + 128LL * 192 * 1536 + 576 * H + 512 + 128LL * 256 * 512 + H * 128LL * 128;
  CHECK(b.expert_params == experts);
  CHECK(b.other_params == mla + 2 * H + 256 * H + 256);
  CHECK(b.bytes_per_param("bf16") == doctest::Approx(2.0));
  CHECK(b.bytes_per_param("nf4") == doctest::Approx((experts * 0.5625 + (mla + 258 * H + 256) * 2.0) / (experts + mla + 258 * H + 256)));
  CHECK(b.bytes_per_param("nf4") == doctest::Approx(0.5861).epsilon(1e-4));
  CHECK(b.bytes_per_param("mxfp4") == doctest::Approx(0.5554).epsilon(1e-4));
  // inspect prints the line (the tiny preset: layer 1 is its first sparse layer).
  const fs::path dir = ax::test::scratch_dir("inspect_dsv3");
  ax::init_model_dir("tiny-deepseek-v3", dir.string(), 5);
  const std::string out = ax::inspect_model_dir(dir.string());
  CHECK(out.find("MoE layer 1    ") != std::string::npos);
  CHECK(out.find("bf16 2 B/param") != std::string::npos);
  CHECK(out.find("nf4 experts ") != std::string::npos);
  ax::test::remove_tree(dir);
}
