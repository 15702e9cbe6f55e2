// Family details beyond the parity goldens (model_parity_test.cpp): how each family reads its sliding-window,
// bias and dropout keys (as its transformers class does), and the family hint for an unknown model_type.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/models.hpp"
#include "data/packing.hpp"
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



// The base model's logits (no adapter) on the case's golden input_ids.
at::Tensor logits_of(const fs::path& dir, const std::string& golden_case) {
  ax::Registry reg;
  ax::test::add_naive_backends(reg);
  ax::models::register_builtin_models(reg);
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  auto model = ax::load_model(reg, o);
  auto g = ax::safetensors::File::open((case_dir(golden_case) / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  return model->forward(b, true).logits.detach();
}

}  // namespace

TEST_CASE("families: qwen2 windows from layer_types or max_window_layers, only with use_sliding_window") {
  const json good = config_of("qwen2");  // written by transformers 5: layer_types [full, sliding, sliding], window 3
  auto c = ax::models::parse_hf_config(good, "q");
  CHECK(c.qkv_bias);
  CHECK_FALSE(c.o_bias);
  CHECK(c.layer_window == std::vector<int64_t>{-1, 3, 3});
  // Hub Qwen2.5 configs (transformers 4) have no layer_types: layers from max_window_layers on slide.
  json hub = good;
  hub.erase("layer_types");
  CHECK(ax::models::parse_hf_config(hub, "q").layer_window == std::vector<int64_t>{-1, 3, 3});
  hub["max_window_layers"] = 2;
  CHECK(ax::models::parse_hf_config(hub, "q").layer_window == std::vector<int64_t>{-1, -1, 3});
  hub.erase("sliding_window");  // Qwen2Config's default window
  CHECK(ax::models::parse_hf_config(hub, "q").layer_window == std::vector<int64_t>{-1, -1, 4096});
  hub["use_sliding_window"] = false;  // Qwen2.5's shipped configs: sliding_window set but unused
  hub["sliding_window"] = 131072;
  CHECK(ax::models::parse_hf_config(hub, "q").window(2) == -1);

  json bad = good;
  bad["use_sliding_window"] = false;  // layer_types names sliding layers but there is no window: transformers raises
  CHECK(parse_error(bad).find("'layer_types[1]' is sliding_attention but no sliding window is set") != std::string::npos);
  bad = good;
  bad["layer_types"][2] = "chunked_attention";
  CHECK(parse_error(bad).find("'layer_types[2]' must be \"full_attention\" or \"sliding_attention\"") != std::string::npos);
  bad["layer_types"] = {"full_attention"};
  CHECK(parse_error(bad).find("must be a list of num_hidden_layers = 3 entries") != std::string::npos);
  bad = good;
  bad["mlp_bias"] = true;
  CHECK(parse_error(bad).find("'mlp_bias' true is not supported for qwen2") != std::string::npos);

  // The derived windows run as transformers' layer_types do (the golden's logits come from those), and the
  // window matters: without it the logits move.
  json derived = good;
  derived.erase("layer_types");
  EditedModel a("qwen2", derived, "qwen2_derived");
  EditedModel full("qwen2", [&] { json j = derived; j["use_sliding_window"] = false; return j; }(), "qwen2_full");
  at::Tensor want = logits_of(case_dir("qwen2"), "qwen2");
  CHECK(at::allclose(logits_of(a.dir, "qwen2"), want, 0, 0));
  CHECK((logits_of(full.dir, "qwen2") - want).abs().max().item<double>() > 1e-2);
}

TEST_CASE("families: mistral slides every layer (default 4096), refuses layer_types and biases") {
  const json good = config_of("mistral");
  CHECK(ax::models::parse_hf_config(good, "m").layer_window == std::vector<int64_t>{4, 4});
  json j = good;
  j.erase("sliding_window");
  CHECK(ax::models::parse_hf_config(j, "m").layer_window == std::vector<int64_t>{4096, 4096});
  j["sliding_window"] = nullptr;  // Mistral-7B-v0.3's config: full attention
  CHECK(ax::models::parse_hf_config(j, "m").layer_window.empty());
  j = good;
  j["layer_types"] = {"sliding_attention", "full_attention"};
  CHECK(parse_error(j).find("'layer_types' is not supported for mistral") != std::string::npos);
  j = good;
  j["attention_bias"] = true;
  CHECK(parse_error(j).find("'attention_bias' true is not supported for mistral") != std::string::npos);
  j["attention_bias"] = false;
  CHECK(parse_error(j).empty());
  json mixtral = config_of("mixtral");
  mixtral["attention_bias"] = true;
  CHECK(parse_error(mixtral).find("'attention_bias' true is not supported for mixtral") != std::string::npos);
  mixtral = config_of("mixtral");
  mixtral.erase("rope_parameters");  // MixtralConfig.default_theta
  CHECK(ax::models::parse_hf_config(mixtral, "x").rope.theta == 1e6);
}

TEST_CASE("families: llama ignores sliding_window as transformers' llama does") {
  json j = config_of("llama");
  j["sliding_window"] = 3;  // < the 7 golden tokens: it would change the logits if applied
  CHECK(ax::models::parse_hf_config(j, "l").layer_window.empty());
  EditedModel m("llama", j, "llama_window");
  CHECK(at::allclose(logits_of(m.dir, "llama"), logits_of(case_dir("llama"), "llama"), 0, 0));
}

TEST_CASE("families: attention_dropout > 0 is refused, not silently skipped") {
  for (const char* name : {"llama", "qwen2", "mistral", "qwen3_moe"}) {
    CAPTURE(name);
    json j = config_of(name);
    j["attention_dropout"] = 0.1;
    CHECK(parse_error(j).find("'attention_dropout' must be 0, got 0.1 (attention dropout is not supported)") != std::string::npos);
    j["attention_dropout"] = 0;
    CHECK(parse_error(j).empty());
  }
}

TEST_CASE("families: an unknown model_type is hinted only at a family of the same kind (dense / MoE)") {
  ax::Registry reg;
  ax::test::add_naive_backends(reg);
  ax::models::register_builtin_models(reg);
  auto error_for = [&](json cfg, const std::string& tag) {
    EditedModel m("mistral", cfg, tag);
    ax::ModelLoadOptions o;
    o.dir = m.dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    try {
      ax::load_model(reg, o);
    } catch (const ax::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json dense = config_of("mistral");
  dense["model_type"] = "mixtrl";  // one edit from mixtral, but a dense config: not a misspelt mixtral
  std::string e = error_for(dense, "hint_dense");
  CHECK(e.find("model_type 'mixtrl' has no model family") != std::string::npos);
  CHECK(e.find("did you mean") == std::string::npos);
  json moe = dense;
  moe["num_local_experts"] = 4;
  CHECK(error_for(moe, "hint_moe").find("did you mean 'mixtral'?") != std::string::npos);
  dense["model_type"] = "mistrall";
  CHECK(error_for(dense, "hint_typo").find("did you mean 'mistral'?") != std::string::npos);
}

TEST_CASE("families: make_batch marks padding in extras[\"attention_mask\"], only where there is padding") {
  std::vector<ax::Sample> s{{{1, 2, 3}, {1, 2, 3}}, {{4, 5}, {4, 5}}, {{6, 7, 8, 9}, {6, 7, 8, 9}}};
  auto packed = ax::data::pack_samples(s, {0, 1, 2}, 6);  // [1 2 3 4 5 pad] [6 7 8 9 pad pad]
  auto b = ax::data::make_batch(s, packed, {0, 1}, 6, 0);
  REQUIRE(b.extras.count("attention_mask"));
  CHECK(at::equal(b.extras.at("attention_mask"), at::tensor({1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0}, at::kLong).view({2, 6})));
  auto full = ax::data::pack_samples(s, {0, 1}, 5);  // [1 2 3 4 5]: no padding, no mask
  CHECK_FALSE(ax::data::make_batch(s, full, {0}, 5, 0).extras.count("attention_mask"));
}

TEST_CASE("families: the MoE router aux loss leaves padding out as transformers does with an attention mask") {
  for (const char* name : {"qwen3_moe", "qwen3_moe_top1"}) {
    CAPTURE(name);
    ax::Registry reg;
    ax::test::add_naive_backends(reg);
    ax::models::register_builtin_models(reg);
    ax::ModelLoadOptions o;
    o.dir = case_dir(name).string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    auto model = ax::load_model(reg, o);
    // From scripts/goldens/make_model_goldens.py: row 0 ends in 3 padding tokens, row 1 in 1.
    auto g = ax::safetensors::File::open((case_dir(name) / "aux_mask.safetensors").string());
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    const double unmasked = model->forward(b, false).aux_loss.item<double>();
    CHECK(unmasked == doctest::Approx(g->get("aux_loss_unmasked").item<double>()).epsilon(1e-5));
    b.extras["attention_mask"] = g->get("attention_mask");
    const double masked = model->forward(b, false).aux_loss.item<double>();
    CHECK(masked == doctest::Approx(g->get("aux_loss").item<double>()).epsilon(1e-5));
    CHECK(std::abs(masked - unmasked) > 1e-3);  // the padding did count before
    b.extras["attention_mask"] = at::ones({3}, at::kLong);
    CHECK_THROWS_WITH_AS(model->forward(b, false), doctest::Contains("extras[\"attention_mask\"] has shape [3]"), ax::UsageError);
  }
}

TEST_CASE("families: yarn and dynamic RoPE frequencies and attention factor equal transformers'") {
  // scripts/goldens/make_model_goldens.py rope: transformers' ROPE_INIT_FUNCTIONS on each parameter set.
  const json cases = ax::models::read_json_file((fs::path(AXENGINE_TEST_DATA_DIR) / "rope_goldens.json").string());
  REQUIRE(cases.size() >= 7);
  for (const auto& c : cases) {
    CAPTURE(c["config"].dump());
    CAPTURE(c["seq_len"].get<int64_t>());
    auto cfg = ax::models::parse_hf_config(c["config"], "rope");
    at::Tensor got = ax::models::rope_inv_freq(cfg, c["seq_len"].get<int64_t>());
    at::Tensor want = at::tensor(c["inv_freq"].get<std::vector<double>>(), at::kFloat);
    REQUIRE(got.sizes() == want.sizes());
    CHECK(((got - want).abs() / want.abs()).max().item<double>() <= 1e-6);
    CHECK(cfg.rope.attention_factor == doctest::Approx(c["attention_factor"].get<double>()).epsilon(1e-12));
  }
}

TEST_CASE("families: yarn and dynamic RoPE keys are checked and name the key") {
  json j = config_of("qwen3_yarn");
  j["rope_parameters"].erase("factor");
  CHECK(parse_error(j).find("'rope_parameters.factor' is required for rope_type yarn") != std::string::npos);
  j = config_of("qwen3_yarn");
  j["rope_parameters"]["beta_fast"] = -3;
  CHECK(parse_error(j).find("'rope_parameters.beta_fast' must be a finite number > 0") != std::string::npos);
  j = config_of("qwen3_yarn");
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  CHECK(parse_error(j).find("partial rotary is not supported") != std::string::npos);
  j = config_of("qwen3_yarn");  // no original length anywhere: max_position_embeddings, as transformers
  j["rope_parameters"].erase("original_max_position_embeddings");
  CHECK(ax::models::parse_hf_config(j, "y").rope.original_max_position == 256);
  j["original_max_position_embeddings"] = 32;  // a top-level key wins (transformers' standardize_rope_params)
  j["rope_parameters"]["original_max_position_embeddings"] = 64;
  CHECK(ax::models::parse_hf_config(j, "y").rope.original_max_position == 32);
  j = config_of("qwen3_yarn");  // a negative attention factor
  j["rope_parameters"]["mscale"] = -20.0;
  j["rope_parameters"]["mscale_all_dim"] = 1.0;
  CHECK(parse_error(j).find("'rope_parameters.mscale' gives the attention factor -") != std::string::npos);
  j = config_of("llama_dynamic");
  j["head_dim"] = 2;
  CHECK(parse_error(j).find("'head_dim' must be > 2 for rope_type dynamic") != std::string::npos);
  j = config_of("llama_dynamic");  // f·L - (f - 1) is inf - inf in fp32 once the base grows: refused there
  j["rope_parameters"]["factor"] = 1e300;
  auto huge = ax::models::parse_hf_config(j, "big");
  CHECK_THROWS_WITH_AS(ax::models::rope_inv_freq(huge, 70), doctest::Contains("gives non-finite RoPE frequencies at length 70"),
                       ax::UsageError);
  j = config_of("llama_dynamic");
  j.erase("max_position_embeddings");
  CHECK(parse_error(j).find("'max_position_embeddings' is required for rope_type dynamic") != std::string::npos);
  // transformers 4 spelling: rope_scaling {"type": "dynamic"}.
  j = config_of("llama_dynamic");
  j.erase("rope_parameters");
  j["rope_theta"] = 500.0;
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 3.0}};
  auto c = ax::models::parse_hf_config(j, "d");
  CHECK(at::equal(ax::models::rope_inv_freq(c, 7), ax::models::rope_inv_freq(ax::models::parse_hf_config(config_of("llama_dynamic"), "d"), 7)));
  CHECK(at::equal(ax::models::rope_inv_freq(c, 5), ax::models::rope_inv_freq(c)));  // within max_position_embeddings
  CHECK_FALSE(at::equal(ax::models::rope_inv_freq(c, 6), ax::models::rope_inv_freq(c)));
}

TEST_CASE("families: dynamic RoPE follows each batch's longest sample, as transformers on that batch alone") {
  // A packed batch whose longest sample is 4 tokens (<= max_position_embeddings 5) uses the plain frequencies;
  // the same tokens as one 7-token row use the grown base. Each equals the model on that input alone.
  ax::Registry reg;
  ax::test::add_naive_backends(reg);
  ax::models::register_builtin_models(reg);
  ax::ModelLoadOptions o;
  o.dir = case_dir("llama_dynamic").string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  auto model = ax::load_model(reg, o);
  std::vector<ax::Sample> s{{{1, 2, 3, 4}, {1, 2, 3, 4}}, {{5, 6, 7}, {5, 6, 7}}};
  auto packed = ax::data::pack_samples(s, {0, 1}, 7);
  REQUIRE(packed.rows.size() == 1);
  auto b = ax::data::make_batch(s, packed, {0}, 7, 0);
  at::Tensor logits = model->forward(b, true).logits.detach();
  ax::Batch alone;
  alone.input_ids = at::tensor({1, 2, 3, 4}, at::kLong).view({1, 4});
  CHECK(at::allclose(logits.narrow(1, 0, 4), model->forward(alone, true).logits, 1e-5, 1e-6));
  ax::Batch whole;  // the 7 tokens as one sample: positions 0..6, beyond 5
  whole.input_ids = b.input_ids;
  at::Tensor grown = model->forward(whole, true).logits.detach();
  CHECK_FALSE(at::allclose(grown.narrow(1, 0, 4), logits.narrow(1, 0, 4), 1e-4, 1e-5));
}
