// qwen3_5 (Qwen3.5 dense: Gated DeltaNet + gated full attention) beyond the parity case of model_parity_test.cpp
// (tests/data/models/qwen3_5, scripts/goldens/make_model_goldens.py): packing (two samples in one row give the
// logits and loss they give in rows of their own: the recurrent state and the conv window restart at the
// sample boundary) and merge-lora against transformers+peft's logits (qwen3_5_moe's too, model_hybrid_checks.hpp),
// and the config / checkpoint refusals.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "models/decoder.hpp"
#include "unit/model_hybrid_checks.hpp"

namespace fs = std::filesystem;
using ax::test::rel_max;

TEST_CASE("qwen3_5, qwen3_5_moe: two samples packed in one row give their own rows' logits and loss (state and conv window reset)") {
  ax::test::check_packed_rows("qwen3_5");
  ax::test::check_packed_rows("qwen3_5_moe");
}

TEST_CASE("qwen3_5, qwen3_5_moe: merge-lora folds every adapter (linear_attn, self_attn, mlp, experts) into a model with transformers+peft's logits") {
  ax::test::check_merge_lora("qwen3_5");
  ax::test::check_merge_lora("qwen3_5_moe");
}

TEST_CASE("qwen3_5, qwen3_5_moe: merge-lora of the multimodal checkpoint keeps its layout and its vision tower") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const auto& [name, type] : {std::pair{"qwen3_5_vl", "qwen3_5"}, std::pair{"qwen3_5_moe_vl", "qwen3_5_moe"}}) {
    CAPTURE(name);
    const fs::path base = ax::test::case_dir(name);
    const fs::path out = ax::test::scratch_dir(std::string("merge_") + name) / "merged";
    ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "");
    auto merged = ax::safetensors::Checkpoint::open_dir(out.string());
    auto orig = ax::safetensors::Checkpoint::open_dir(base.string());
    CHECK(merged.names() == orig.names());  // per-expert experts under model.language_model. included
    for (const auto& n : orig.names())
      if (n.rfind("model.visual.", 0) == 0) CHECK(at::equal(merged.get(n), orig.get(n)));
    CHECK(ax::models::read_json_file((out / "config.json").string())["model_type"] == type);
    auto golden = ax::safetensors::File::open((base / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = golden->get("input_ids");
    CHECK(rel_max(ax::test::load_hybrid(reg, out.string())->forward(b, true).logits, golden->get("logits")) <= 1e-4);
    ax::test::remove_tree(out.parent_path());
  }
}

TEST_CASE("qwen3_5: config.json refusals name the key (layer_types, head counts, partial rotary)") {
  const nlohmann::json base = ax::test::config_of("qwen3_5");
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = base;
    j[key] = v;
    return ax::test::parse_error(j);
  };
  CHECK(ax::test::parse_error(base) == "");
  CHECK(with("layer_types", {"linear_attention", "sliding_attention", "full_attention"})
            .find("'layer_types[1]' must be \"linear_attention\" or \"full_attention\"") != std::string::npos);
  CHECK(with("layer_types", {"linear_attention", "full_attention"}).find("'layer_types' must be a list of num_hidden_layers = 3") !=
        std::string::npos);
  CHECK(with("full_attention_interval", 3).find("'layer_types' disagrees with full_attention_interval 3 at layer 1") !=
        std::string::npos);
  CHECK(with("full_attention_interval", 2) == "");  // agrees: layer 1 full
  CHECK(with("linear_num_value_heads", 3).find("'linear_num_value_heads' 3 is not a multiple of linear_num_key_heads 2") !=
        std::string::npos);
  CHECK(with("num_key_value_heads", 3).find("'num_key_value_heads' 3 does not divide") != std::string::npos);
  nlohmann::json j = base;
  j["rope_parameters"]["partial_rotary_factor"] = 0.1;  // 0.8 of a rotary dim
  CHECK(ax::test::parse_error(j).find("'partial_rotary_factor' 0.1 x head_dim 8 gives the rotary dim 0") != std::string::npos);
  j["rope_parameters"]["partial_rotary_factor"] = 1.5;
  CHECK(ax::test::parse_error(j).find("'rope_parameters.partial_rotary_factor' must be in (0, 1]") != std::string::npos);
  // Without layer_types: every full_attention_interval-th layer (default 4) is full attention.
  j = base;
  j.erase("layer_types");
  j["num_hidden_layers"] = 8;
  auto c = ax::models::parse_hf_config(j, "c.json");
  for (int64_t i = 0; i < 8; ++i) CHECK(c.is_linear_layer(i) == (i != 3 && i != 7));
  CHECK(c.rotary_dim == 4);
  CHECK(c.attn_output_gate);
  // Another family keeps refusing partial rotary.
  nlohmann::json q3 = ax::test::config_of("qwen3");
  q3["rope_parameters"]["partial_rotary_factor"] = 0.5;
  CHECK(ax::test::parse_error(q3).find("partial rotary is not supported") != std::string::npos);
}

TEST_CASE("qwen3_5: a checkpoint without A_log / dt_bias, or with a conv kernel other than the config's, is refused naming the tensor") {
  ax::Registry reg;
  ax::register_builtins(reg);
  const fs::path src = ax::test::case_dir("qwen3_5");
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  for (const char* missing : {"model.layers.2.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias"}) {
    CAPTURE(missing);
    const fs::path d = ax::test::scratch_dir("qwen3_5_missing");
    fs::copy_file(src / "config.json", d / "config.json");
    std::vector<std::pair<std::string, at::Tensor>> ts;
    for (const auto& n : ckpt.names())
      if (n != missing) ts.emplace_back(n, ckpt.get(n));
    ax::safetensors::save((d / "model.safetensors").string(), ts);
    const std::string e = ax::test::hybrid_load_error(reg, d);
    CHECK(e.find("missing tensor") != std::string::npos);
    CHECK(e.find(missing) != std::string::npos);
    ax::test::remove_tree(d);
  }
  nlohmann::json cfg = ax::test::config_of("qwen3_5");
  cfg["linear_conv_kernel_dim"] = 4;
  ax::test::EditedModel edited("qwen3_5", cfg, "qwen3_5_conv");
  CHECK(ax::test::hybrid_load_error(reg, edited.dir).find("'model.layers.0.linear_attn.conv1d.weight' has shape [44, 1, 3] but") != std::string::npos);
}
