// gemma3_text and olmoe beyond the parity goldens (model_parity_test.cpp): how their configs are read (as
// Gemma3TextConfig / OlmoeConfig read them) and what is refused, by key.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "models/hf_config.hpp"
#include "models/register.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using ax::test::case_dir;
using ax::test::config_of;
using ax::test::EditedModel;
using ax::test::parse_error;
json json_of(const fs::path& p) { return ax::models::read_json_file(p.string()); }



std::unique_ptr<ax::Model> load(const fs::path& dir, ax::Registry& reg) {
  ax::test::add_naive_backends(reg);
  ax::models::register_builtin_models(reg);
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  return ax::load_model(reg, o);
}

// The base model's logits (no adapter) on the case's golden input_ids.
at::Tensor logits_of(const fs::path& dir, const std::string& golden_case) {
  ax::Registry reg;
  auto model = load(dir, reg);
  auto g = ax::safetensors::File::open((case_dir(golden_case) / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  return model->forward(b, true).logits.detach();
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("gemma3_text: config keys as Gemma3TextConfig reads them") {
  const json good = json_of(case_dir("gemma3") / "config.json");
  auto c = ax::models::parse_hf_config(good, "g");
  CHECK(c.norm_offset);
  CHECK(c.sandwich_norms);
  CHECK(c.qk_norm);
  CHECK(c.tie_word_embeddings);
  CHECK(c.mlp_act == "gelu_pytorch_tanh");
  CHECK(c.layer_window == std::vector<int64_t>{3, -1, 3});
  CHECK(c.attn_scale == doctest::Approx(1 / std::sqrt(12.0)).epsilon(1e-15));
  CHECK(c.embed_scale == doctest::Approx(std::sqrt(20.0)).epsilon(1e-15));
  CHECK(c.rope.type == "linear");
  CHECK(c.rope.factor == 2.0);
  CHECK(c.rope_of(1).theta == 10000.0);
  CHECK(c.rope_of(0).type == "default");
  CHECK(c.rope_of(0).theta == 100.0);
  // The class defaults where keys are missing: every 6th layer full, window 4096, head_dim 256, tied, θ 1e6/1e4.
  json d = good;
  for (const char* k : {"layer_types", "sliding_window", "head_dim", "tie_word_embeddings", "rope_parameters"}) d.erase(k);
  c = ax::models::parse_hf_config(d, "g");
  CHECK(c.layer_window == std::vector<int64_t>{4096, 4096, 4096});
  CHECK(c.head_dim == 256);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rope.theta == 1e6);
  CHECK(c.rope_local.theta == 1e4);
  d["sliding_window_pattern"] = 2;  // the transformers 4 key: layers 1, 3, ... full
  CHECK(ax::models::parse_hf_config(d, "g").layer_window == std::vector<int64_t>{4096, -1, 4096});
  // gemma3_text reads hidden_activation; hidden_act is not its key (transformers ignores it too).
  d["hidden_act"] = "gelu";
  CHECK(parse_error(d).empty());
}

TEST_CASE("gemma3_text: what transformers would compute differently is refused, naming the key") {
  const json good = json_of(case_dir("gemma3") / "config.json");
  auto with = [&](const std::string& key, const json& v) {
    json j = good;
    j[key] = v;
    return parse_error(j);
  };
  CHECK(has(with("attn_logit_softcapping", 50.0), "'attn_logit_softcapping' is not supported (must be null"));
  CHECK(has(with("final_logit_softcapping", 30.0), "'final_logit_softcapping' is not supported (must be null"));
  CHECK(has(with("use_bidirectional_attention", true), "'use_bidirectional_attention' true is not supported"));
  CHECK(has(with("hidden_activation", "gelu"), "'hidden_activation' 'gelu' is not supported for gemma3_text"));
  CHECK(has(with("query_pre_attn_scalar", 0), "'query_pre_attn_scalar' must be a finite number > 0"));
  CHECK(has(with("sliding_window", nullptr), "'sliding_window' is null but layer 0 is sliding_attention"));
  CHECK(has(with("rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10.0}}), "'rope_parameters.rope_theta' is not a layer type"));  // keys in sorted order
  CHECK(has(with("rope_parameters", {{"full_attention", {{"rope_type", "longrope"}}}}), "'rope_parameters.rope_type' 'longrope' is not supported"));
  CHECK(has(with("rope_parameters", {{"sliding_attention", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}),
            "dynamic is not supported for the sliding layers"));
  CHECK(has(with("layer_types", {"sliding_attention"}), "must be a list of num_hidden_layers = 3 entries"));
  CHECK(has(with("attention_dropout", 0.1), "'attention_dropout' must be 0"));
}

TEST_CASE("gemma3_text: the transformers 4 spelling (rope_theta, rope_local_base_freq, rope_scaling) runs as rope_parameters") {
  // config_v4.json is the golden config respelt; make_model_goldens.py asserts transformers reads it back the same.
  const json v4 = json_of(case_dir("gemma3") / "config_v4.json");
  REQUIRE_FALSE(v4.contains("rope_parameters"));
  EditedModel m("gemma3", v4, "gemma3_v4");
  at::Tensor want = logits_of(case_dir("gemma3"), "gemma3");
  CHECK(at::allclose(logits_of(m.dir, "gemma3"), want, 0, 0));
  // The local RoPE matters: with the global one on every layer the logits move.
  json same = v4;
  same["rope_local_base_freq"] = 10000.0;
  EditedModel g("gemma3", same, "gemma3_same_rope");
  CHECK((logits_of(g.dir, "gemma3") - want).abs().max().item<double>() > 1e-3);
}

// model_type gemma3 is the multimodal model (models/gemma3_mm.cpp): a text-only checkpoint under it lacks the tower.
TEST_CASE("gemma3_text: a multimodal gemma3 config over a text-only checkpoint is refused naming the vision tower's tensor") {
  json j = json_of(case_dir("gemma3") / "config.json");
  j = {{"model_type", "gemma3"}, {"text_config", j}, {"vision_config", {{"image_size", 896}, {"patch_size", 14}}},
       {"image_token_index", 50}, {"boi_token_index", 51}, {"eoi_token_index", 52}};
  EditedModel m("gemma3", j, "gemma3_multimodal");
  ax::Registry reg;
  try {
    load(m.dir, reg);
    FAIL("loaded");
  } catch (const ax::UsageError& e) {
    INFO(std::string(e.what()));
    CHECK(has(e.what(), "vision_tower.embeddings.patch_embedding.weight"));
  }
}

TEST_CASE("gemma3_text: init-model's tiny-gemma3 loads and its norms start at the unit scale (w = 0)") {
  const fs::path dir = ax::test::scratch_dir("tiny_gemma3");
  fs::remove_all(dir);
  ax::init_model_dir("tiny-gemma3", dir.string(), 3);
  auto cfg = ax::models::parse_hf_config(json_of(dir / "config.json"), "tiny");
  CHECK(cfg.model_type == "gemma3_text");
  CHECK(cfg.layer_window == std::vector<int64_t>{64, -1});
  auto ckpt = ax::safetensors::Checkpoint::open_dir(dir.string());
  CHECK(ckpt.get("model.layers.0.pre_feedforward_layernorm.weight").abs().max().item<double>() == 0.0);
  const std::string about = ax::inspect_model_dir(dir.string());
  CHECK(has(about, "rope default theta 1e+06 (sliding layers: default theta 10000)"));
  CHECK(has(about, "(1 + w) norms, sandwich norms"));
  ax::Registry reg;
  auto model = load(dir, reg);
  ax::Batch b;
  b.input_ids = at::arange(10, at::kLong).view({1, 10});
  CHECK(at::isfinite(model->forward(b, true).logits).all().item<bool>());
  ax::test::remove_tree(dir);
}

TEST_CASE("olmoe: config keys as OlmoeConfig reads them; clip_qkv clamps") {
  const json good = json_of(case_dir("olmoe") / "config.json");
  auto c = ax::models::parse_hf_config(good, "o");
  CHECK(c.qk_norm_full);
  CHECK_FALSE(c.qk_norm);
  CHECK(c.clip_qkv == 1.1);
  CHECK(c.num_experts == 5);
  CHECK(c.moe_intermediate_size == 6);
  CHECK(c.is_moe_layer(0));
  CHECK(c.is_moe_layer(1));
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  json d = good;
  for (const char* k : {"norm_topk_prob", "router_aux_loss_coef", "clip_qkv"}) d.erase(k);
  c = ax::models::parse_hf_config(d, "o");
  CHECK_FALSE(c.norm_topk_prob);
  CHECK(c.router_aux_loss_coef == 0.01);
  CHECK(c.clip_qkv == 0.0);

  json bad = good;
  bad["clip_qkv"] = 0;
  CHECK(has(parse_error(bad), "'clip_qkv' must be null or a finite number > 0"));
  bad = good;
  bad["head_dim"] = 8;  // OlmoeAttention sizes its norms from hidden_size / heads = 4
  CHECK(has(parse_error(bad), "'head_dim' 8 is not hidden_size / num_attention_heads"));
  bad = good;
  bad["mlp_bias"] = true;
  CHECK(has(parse_error(bad), "'mlp_bias' true is not supported for olmoe"));

  // The clamp is active on the golden (the parity test's logits include it): without it the logits move.
  json unclipped = good;
  unclipped["clip_qkv"] = nullptr;
  EditedModel m("olmoe", unclipped, "olmoe_unclipped");
  CHECK((logits_of(m.dir, "olmoe") - logits_of(case_dir("olmoe"), "olmoe")).abs().max().item<double>() > 1e-3);
}

TEST_CASE("olmoe: init-model's tiny-olmoe loads, per-layer experts and full-width q/k norms") {
  const fs::path dir = ax::test::scratch_dir("tiny_olmoe");
  fs::remove_all(dir);
  ax::init_model_dir("tiny-olmoe", dir.string(), 3);
  auto ckpt = ax::safetensors::Checkpoint::open_dir(dir.string());
  CHECK(ckpt.info("model.layers.1.self_attn.q_norm.weight").shape == std::vector<int64_t>{64});
  CHECK(ckpt.info("model.layers.1.self_attn.k_norm.weight").shape == std::vector<int64_t>{32});
  CHECK(ckpt.has("model.layers.1.mlp.experts.7.up_proj.weight"));
  CHECK(has(ax::inspect_model_dir(dir.string()), "q/k norm over all heads"));
  ax::Registry reg;
  auto model = load(dir, reg);
  ax::Batch b;
  b.input_ids = at::arange(10, at::kLong).view({1, 10});
  auto out = model->forward(b, true);
  CHECK(at::isfinite(out.logits).all().item<bool>());
  CHECK(out.aux_loss.defined());
  ax::test::remove_tree(dir);
}

// Both golden rows packed into one row (positions restart, cu_seqlens bound the samples): the same logits and
// loss as the two rows apart (whose parity with transformers is model_parity_test's). Sliding windows, the
// local/global RoPE and the routing must all stay inside each sample.
TEST_CASE("gemma3_text and olmoe: a packed row gives the logits and loss of its samples as separate rows") {
  for (const std::string name : {"gemma3", "olmoe"}) {
    CAPTURE(name);
    ax::Registry reg;
    auto model = load(case_dir(name), reg);
    auto g = ax::safetensors::File::open((case_dir(name) / "golden.safetensors").string());
    const at::Tensor ids = g->get("input_ids"), labels = g->get("labels");
    const int64_t B = ids.size(0), S = ids.size(1);
    ax::Batch b;
    b.input_ids = ids.reshape({1, B * S});
    b.labels = labels.reshape({1, B * S});
    b.position_ids = at::arange(S, at::kLong).repeat({B}).view({1, B * S});
    b.cu_seqlens = (at::arange(B + 1, at::kInt) * int(S));
    b.max_seqlen = S;
    ax::Batch rows;
    rows.input_ids = ids;
    rows.labels = labels;
    auto want = model->forward(rows, true);
    auto got = model->forward(b, true);
    CHECK((got.logits.view({B, S, -1}) - want.logits).abs().max().item<double>() <= 1e-5);
    CHECK(std::abs(got.loss.item<double>() - want.loss.item<double>()) <= 1e-6);
    // And packing matters: the same row without sample bounds sees across them.
    ax::Batch joined;
    joined.input_ids = b.input_ids;
    auto across = model->forward(joined, true);
    CHECK((across.logits.view({B, S, -1}) - want.logits).abs().max().item<double>() > 1e-3);
  }
}
