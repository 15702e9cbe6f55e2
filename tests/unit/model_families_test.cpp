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
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path case_dir(const std::string& name) { return fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name; }
json config_of(const std::string& name) { return ax::models::read_json_file((case_dir(name) / "config.json").string()); }

std::string parse_error(const json& j) {
  try {
    ax::models::parse_hf_config(j, "dir/config.json");
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

// A model dir with the weights of test case `name` and the config `cfg`; removed on destruction.
struct EditedModel {
  fs::path dir;
  EditedModel(const std::string& name, const json& cfg, const std::string& tag) : dir(ax::test::scratch_dir(tag)) {
    fs::copy_file(case_dir(name) / "model.safetensors", dir / "model.safetensors");
    std::ofstream(dir / "config.json") << cfg.dump();
  }
  ~EditedModel() { ax::test::remove_tree(dir); }
};

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
