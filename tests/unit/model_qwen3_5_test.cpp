// qwen3_5 (Qwen3.5 dense: Gated DeltaNet + gated full attention) beyond the parity case of model_parity_test.cpp
// (tests/data/models/qwen3_5, scripts/goldens/make_model_goldens.py): packing (two samples in one row give the
// logits and loss they give in rows of their own: the recurrent state and the conv window restart at the
// sample boundary), merge-lora against transformers+peft's logits, and the config / checkpoint refusals.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/decoder.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

std::unique_ptr<ax::Model> load_qwen3_5(const ax::Registry& reg, const std::string& dir, bool adapter) {
  ax::ModelLoadOptions o;
  o.dir = dir;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  if (adapter) o.adapter_dir = (ax::test::case_dir("qwen3_5") / "adapter").string();
  return ax::load_model(reg, o);
}

double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

std::string load_error(const ax::Registry& reg, const fs::path& dir) {
  try {
    load_qwen3_5(reg, dir.string(), false);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("qwen3_5: two samples packed in one row give their own rows' logits and loss (state and conv window reset)") {
  ax::Registry reg;
  ax::register_builtins(reg);
  auto model = load_qwen3_5(reg, ax::test::case_dir("qwen3_5").string(), true);
  auto golden = ax::safetensors::File::open((ax::test::case_dir("qwen3_5") / "golden.safetensors").string());
  const at::Tensor ids = golden->get("input_ids"), labels = golden->get("labels");  // [2, 7]
  const int64_t S = ids.size(1);
  ax::Batch b;
  b.input_ids = ids.reshape({1, 2 * S});
  b.labels = labels.reshape({1, 2 * S});
  b.position_ids = at::arange(S, at::kLong).repeat({2}).reshape({1, 2 * S});
  b.cu_seqlens = at::tensor({0, int32_t(S), int32_t(2 * S)}, at::kInt);
  b.max_seqlen = S;
  auto out = model->forward(b, true);
  CHECK(rel_max(out.logits.reshape({2, S, -1}), golden->get("logits")) <= 1e-4);
  CHECK(std::abs(out.loss.item<double>() - golden->get("loss").item<double>()) <= 1e-5 * std::max(1.0, out.loss.item<double>()));
  // Without the boundary the second sample would read the first's state: its logits differ (the test can fail).
  ax::Batch joined = b;
  joined.position_ids = at::arange(2 * S, at::kLong).reshape({1, 2 * S});
  joined.cu_seqlens = at::Tensor();
  joined.max_seqlen = 0;
  CHECK(rel_max(model->forward(joined, true).logits.reshape({2, S, -1})[1], golden->get("logits")[1]) > 1e-3);
}

TEST_CASE("qwen3_5: merge-lora folds every adapter (linear_attn, self_attn, mlp) into a model with transformers+peft's logits") {
  ax::Registry reg;
  ax::register_builtins(reg);
  const fs::path base = ax::test::case_dir("qwen3_5");
  const fs::path out = ax::test::scratch_dir("merge_qwen3_5") / "merged";
  ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "");
  auto golden = ax::safetensors::File::open((base / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  CHECK(rel_max(load_qwen3_5(reg, out.string(), false)->forward(b, true).logits, golden->get("logits")) <= 1e-4);
  // The merged checkpoint has the base's tensor names and shapes (conv1d.weight [C, 1, W] included).
  auto merged = ax::safetensors::Checkpoint::open_dir(out.string());
  auto orig = ax::safetensors::Checkpoint::open_dir(base.string());
  CHECK(merged.names() == orig.names());
  for (const auto& n : orig.names()) CHECK(merged.info(n).shape == orig.info(n).shape);
  ax::test::remove_tree(out.parent_path());
}

TEST_CASE("qwen3_5: merge-lora of the multimodal checkpoint keeps its layout and its vision tower") {
  ax::Registry reg;
  ax::register_builtins(reg);
  const fs::path base = ax::test::case_dir("qwen3_5_vl");
  const fs::path out = ax::test::scratch_dir("merge_qwen3_5_vl") / "merged";
  ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "");
  auto merged = ax::safetensors::Checkpoint::open_dir(out.string());
  auto orig = ax::safetensors::Checkpoint::open_dir(base.string());
  CHECK(merged.names() == orig.names());
  for (const auto& n : orig.names())
    if (n.rfind("model.visual.", 0) == 0) CHECK(at::equal(merged.get(n), orig.get(n)));
  CHECK(ax::models::read_json_file((out / "config.json").string())["model_type"] == "qwen3_5");
  auto golden = ax::safetensors::File::open((base / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  CHECK(rel_max(load_qwen3_5(reg, out.string(), false)->forward(b, true).logits, golden->get("logits")) <= 1e-4);
  ax::test::remove_tree(out.parent_path());
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
    const std::string e = load_error(reg, d);
    CHECK(e.find("missing tensor") != std::string::npos);
    CHECK(e.find(missing) != std::string::npos);
    ax::test::remove_tree(d);
  }
  nlohmann::json cfg = ax::test::config_of("qwen3_5");
  cfg["linear_conv_kernel_dim"] = 4;
  ax::test::EditedModel edited("qwen3_5", cfg, "qwen3_5_conv");
  CHECK(load_error(reg, edited.dir).find("'model.layers.0.linear_attn.conv1d.weight' has shape [44, 1, 3] but") != std::string::npos);
}
