// Fine-grained FP8 checkpoints (models/fp8_load.hpp) against transformers 5.23's dequantising load:
// tests/data/models/deepseek_v3_fp8, scripts/goldens/make_fp8_goldens.py (DeepSeek-V3's FP8 layout, tiny: every
// projection float8_e4m3fn with an fp32 weight_scale_inv per [8, 16] block).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "models/fp8_load.hpp"
#include "models/hf_config.hpp"
#include "unit/fp8_case_util.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_hybrid_checks.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

std::unique_ptr<ax::Model> load(const ax::Registry& reg, const fs::path& dir, const std::string& dtype = "fp32") {
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.dtype = dtype;
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  return ax::load_model(reg, o);
}

// The UsageError message of loading `dir` ("" when it loads).
std::string load_error(const ax::Registry& reg, const fs::path& dir) {
  std::string what;
  try {
    load(reg, dir);
  } catch (const ax::UsageError& e) {
    what = e.what();
  }
  return what;
}

using ax::test::EditedFp8;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;
const std::string kKvB = "model.layers.1.self_attn.kv_b_proj.weight";

}  // namespace

TEST_CASE("fp8: a DeepSeek-V3 FP8 checkpoint loads dequantised and gives transformers' logits") {
  ax::Registry reg;
  ax::register_builtins(reg);
  const fs::path dir = ax::test::case_dir("deepseek_v3_fp8");
  auto golden = ax::safetensors::File::open((dir / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  auto m = load(reg, dir);
  CHECK(ax::test::rel_max(m->forward(b, true).logits, golden->get("logits")) <= 1e-5);
  // inspect: the FP8 weights and their scales are used (38 projections in 2 layers), nothing is left over.
  const std::string info = ax::inspect_model_dir(dir.string());
  CHECK(info.find("weights        fp8 e4m3, blocks 8 x 16: 38 tensors with their weight_scale_inv, dequantised at load "
                  "(model.weight_format = \"fp8\" keeps them: ") != std::string::npos);
  CHECK(info.find("(not used)") == std::string::npos);
  // bf16 (the FP8 releases' compute dtype): the dequantised values rounded once more.
  auto m16 = load(reg, dir, "bf16");
  CHECK(ax::test::rel_max(m16->forward(b, true).logits.to(at::kFloat), golden->get("logits")) <= 0.05);
}

TEST_CASE("fp8: edge blocks of a weight whose sizes are not multiples of the block take their block's scale") {
  // transformers' _dequantize_fp8_weight (and DeepSeek's weight_dequant) on a [20, 40] weight in [8, 16] blocks.
  auto f = ax::safetensors::File::open((ax::test::case_dir("deepseek_v3_fp8") / "ragged.safetensors").string());
  const at::Tensor got = ax::models::fp8_dequantize(f->get("weight"), f->get("weight_scale_inv"), 8, 16);
  CHECK(at::equal(got, f->get("dequantized")));
}

TEST_CASE("fp8: a missing or misshapen scale, an FP8 tensor without the config, bad quantization_config keys are refused") {
  ax::Registry reg;
  ax::register_builtins(reg);
  auto keep = [](nlohmann::json&) {};
  auto same = [](Tensors&) {};
  auto find = [](Tensors& t, const std::string& n) -> at::Tensor& {
    for (auto& [name, v] : t)
      if (name == n) return v;
    throw std::runtime_error(n);
  };
  {
    EditedFp8 e([&](Tensors& t) { find(t, kKvB + "_scale_inv") = at::ones({2, 2}); }, keep);
    const std::string err = load_error(reg, e.dir);
    CHECK(err.find("tensor '" + kKvB + "_scale_inv' has shape [2, 2] but '" + kKvB + "' [32, 16] in blocks of "
                   "weight_block_size [8, 16] needs [4, 1]") != std::string::npos);
  }
  {
    EditedFp8 e([&](Tensors& t) { std::erase_if(t, [&](const auto& p) { return p.first == kKvB + "_scale_inv"; }); }, keep);
    CHECK(load_error(reg, e.dir).find("tensor '" + kKvB + "' is FP8 (F8_E4M3) but its scale '" + kKvB + "_scale_inv' is missing") !=
          std::string::npos);
  }
  {
    EditedFp8 e([&](Tensors& t) { find(t, kKvB) = find(t, kKvB).to(at::kFloat8_e5m2); }, keep);
    CHECK(load_error(reg, e.dir).find("has dtype F8_E5M2 but") != std::string::npos);
  }
  {
    EditedFp8 e(same, [](nlohmann::json& c) { c.erase("quantization_config"); });
    CHECK(load_error(reg, e.dir).find("is stored as FP8 (F8_E4M3, with '") != std::string::npos);
  }
  struct Bad {
    const char* key;
    nlohmann::json value;
    const char* says;
  };
  for (const Bad& bad : {Bad{"weight_block_size", nullptr, "'quantization_config.weight_block_size' null (one scale per tensor) is not supported"},
                         Bad{"weight_block_size", {128}, "'quantization_config.weight_block_size' must be two block sizes"},
                         Bad{"weight_block_size", {0, 128}, "'quantization_config.weight_block_size' must be two block sizes"},
                         Bad{"activation_scheme", "static", "'quantization_config.activation_scheme' 'static' is not supported"},
                         Bad{"fmt", "e5m2", "'quantization_config.fmt' 'e5m2' is not supported"},
                         Bad{"scale_fmt", "ue8m0", "'quantization_config.scale_fmt' 'ue8m0' is not supported"},
                         Bad{"input_scale", 1.0, "'quantization_config.input_scale' is not a key of an fp8 quantization_config"}}) {
    CAPTURE(bad.says);
    EditedFp8 e(same, [&](nlohmann::json& c) { c["quantization_config"][bad.key] = bad.value; });
    CHECK(load_error(reg, e.dir).find(bad.says) != std::string::npos);
  }
  // Another block size than the checkpoint's: the scales' grid names it.
  EditedFp8 e(same, [](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = {128, 128}; });
  CHECK(load_error(reg, e.dir).find("in blocks of weight_block_size [128, 128] needs [1, 1]") != std::string::npos);
}
