// gpt_oss beyond the dense parity golden (model_parity_test.cpp): its MXFP4 expert checkpoints loaded packed
// (parity against transformers' own dequantisation, malformed blocks/scales named), how its config keys read
// (class defaults, layer_types, quantization_config), and that attention sinks only go to backends claiming them.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/attention.hpp"
#include "axengine/registry.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using ax::test::case_dir;
using ax::test::config_of;
using ax::test::EditedModel;
using ax::test::parse_error;


std::unique_ptr<ax::Model> load(ax::Registry& reg, const fs::path& dir, const std::string& adapter = "") {
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  if (!adapter.empty()) o.adapter_dir = adapter;
  return ax::load_model(reg, o);
}

std::string load_error(const fs::path& dir) {
  ax::Registry reg;
  ax::register_builtins(reg);
  try {
    load(reg, dir);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

// The mxfp4 case's dir with one tensor replaced (or dropped, when `t` is undefined); removed on destruction.
struct EditedCheckpoint {
  fs::path dir;
  EditedCheckpoint(const std::string& tag, const std::string& key, const at::Tensor& t) : dir(ax::test::scratch_dir(tag)) {
    fs::copy_file(case_dir("gpt_oss_mxfp4") / "config.json", dir / "config.json");
    auto f = ax::safetensors::File::open((case_dir("gpt_oss_mxfp4") / "model.safetensors").string());
    std::vector<std::pair<std::string, at::Tensor>> ts;
    for (const auto& info : f->tensors()) {
      if (info.name != key) ts.emplace_back(info.name, f->get(info.name));
      else if (t.defined()) ts.emplace_back(key, t);
    }
    ax::safetensors::save((dir / "model.safetensors").string(), ts, {{"format", "pt"}}, "test");
  }
  ~EditedCheckpoint() { ax::test::remove_tree(dir); }
};

}  // namespace

TEST_CASE("gpt_oss mxfp4: blocks/scales load packed and match transformers' dequantised model (logits, loss, aux, LoRA grads)") {
  ax::Registry reg;
  ax::register_builtins(reg);
  auto model = load(reg, case_dir("gpt_oss_mxfp4"), (case_dir("gpt_oss_mxfp4") / "adapter").string());
  auto* dm = dynamic_cast<ax::models::DecoderModel*>(model.get());
  REQUIRE(dm);
  const auto stats = model->weight_stats();
  CHECK(stats.format == "mxfp4");
  // Every expert matrix stays packed: 2 layers × (gate_up 3·64·32 + down 3·32·32) values.
  CHECK(stats.packed_params == 2 * (3 * 64 * 32 + 3 * 32 * 32));
  auto g = ax::safetensors::File::open((case_dir("gpt_oss_mxfp4") / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  b.labels = g->get("labels");
  auto out = model->forward(b, true);
  const at::Tensor want = g->get("logits");
  CHECK((out.logits - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>()) <= 1e-4);
  CHECK(std::abs(out.loss.item<double>() - g->get("loss").item<double>()) <= 1e-5 * std::max(1.0, out.loss.item<double>()));
  REQUIRE(out.aux_loss.defined());
  CHECK(std::abs(out.aux_loss.item<double>() - g->get("aux_loss").item<double>()) <= 1e-5);
  out.loss.backward();
  int checked = 0;
  for (const auto& m : dm->lora().modules) {
    CAPTURE(m.site.path);
    for (auto [t, leaf] : {std::pair{&m.a, ".lora_A.weight"}, std::pair{&m.b, ".lora_B.weight"}}) {
      const at::Tensor gw = g->get("grad." + m.peft_key + leaf);
      CHECK((t->grad() - gw).norm().item<double>() / std::max(1e-12, gw.norm().item<double>()) <= 1e-4);
      ++checked;
    }
  }
  CHECK(checked == 2 * 2 * 2);  // q_proj and o_proj of 2 layers, A and B
}

TEST_CASE("gpt_oss mxfp4: malformed or missing blocks/scales, and packed experts without the config, are named errors") {
  const std::string key = "model.layers.1.mlp.experts.down_proj";
  {
    EditedCheckpoint c("gpt_oss_mx_blocks_shape", key + "_blocks", at::zeros({3, 32, 1, 8}, at::kByte));
    const std::string e = load_error(c.dir);
    CHECK(e.find("'" + key + "_blocks' has shape [3, 32, 1, 8]") != std::string::npos);
    CHECK(e.find("implies [3, 32, 1, 16]") != std::string::npos);
  }
  {
    EditedCheckpoint c("gpt_oss_mx_scales_dtype", key + "_scales", at::zeros({3, 32, 1}, at::kFloat));
    CHECK(load_error(c.dir).find("'" + key + "_scales' has dtype F32, MXFP4 scales are U8") != std::string::npos);
  }
  {
    EditedCheckpoint c("gpt_oss_mx_scales_missing", key + "_scales", at::Tensor());
    CHECK(load_error(c.dir).find("'" + key + "_scales' is missing") != std::string::npos);
  }
  {
    EditedCheckpoint c("gpt_oss_mx_no_config", "", at::Tensor());
    json cfg = config_of("gpt_oss_mxfp4");
    cfg.erase("quantization_config");
    std::ofstream(c.dir / "config.json") << cfg.dump();
    CHECK(load_error(c.dir).find("is stored as MXFP4 blocks/scales but") != std::string::npos);
  }
}

TEST_CASE("gpt_oss config: class defaults, layer_types, swiglu keys and the mxfp4 quantization_config") {
  json j = config_of("gpt_oss");
  auto c = ax::models::parse_hf_config(j, "x");
  CHECK(c.attention_sinks);
  CHECK(c.qkv_bias);
  CHECK(c.o_bias);
  CHECK(c.layer_window == std::vector<int64_t>{3, -1});
  CHECK(c.swiglu_limit == 0.6);
  CHECK(c.moe_intermediate_size == c.intermediate_size);
  // GptOssConfig's defaults where keys are missing: head_dim 64, eps 1e-5, window 128 on even layers, YaRN.
  for (const char* k : {"head_dim", "rms_norm_eps", "layer_types", "sliding_window", "rope_parameters", "attention_bias"})
    j.erase(k);
  c = ax::models::parse_hf_config(j, "x");
  CHECK(c.head_dim == 64);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.layer_window == std::vector<int64_t>{128, -1});
  CHECK(c.rope.type == "yarn");
  CHECK(c.rope.theta == 150000.0);
  CHECK(c.rope.factor == 32.0);
  CHECK_FALSE(c.rope.truncate);
  CHECK(c.rope.original_max_position == 4096);
  CHECK(c.qkv_bias);

  j = config_of("gpt_oss");
  j["layer_types"] = {"sliding_attention", "chunked_attention"};
  CHECK(parse_error(j).find("'layer_types[1]' must be \"full_attention\" or \"sliding_attention\"") != std::string::npos);
  j = config_of("gpt_oss");
  j["sliding_window"] = nullptr;
  CHECK(parse_error(j).find("'layer_types[0]' is sliding_attention but sliding_window is null") != std::string::npos);
  j = config_of("gpt_oss");
  j["swiglu_limit"] = -1;
  CHECK(parse_error(j).find("'swiglu_limit' must be a finite number > 0") != std::string::npos);

  j = config_of("gpt_oss_mxfp4");
  CHECK(ax::models::parse_hf_config(j, "x").mxfp4_experts);
  j["quantization_config"]["dequantize"] = true;
  CHECK(parse_error(j).find("'quantization_config.dequantize' is not a key of an mxfp4 quantization_config") != std::string::npos);
  j = config_of("gpt_oss_mxfp4");
  j["quantization_config"]["modules_to_not_convert"] = 3;
  CHECK(parse_error(j).find("'quantization_config.modules_to_not_convert' must be a list of module names") != std::string::npos);
  j = config_of("gpt_oss_mxfp4");
  j["model_type"] = "mixtral";  // mxfp4 is gpt_oss's: another family reads quantization_config as bitsandbytes
  j.erase("attention_bias");
  CHECK(parse_error(j).find("'quantization_config.quant_method' 'mxfp4' is not supported") != std::string::npos);
}

namespace {
// An attention backend that lists layouts without "sinks": a stand-in for a plugin that cannot take them.
struct PlainOnlyAttention : ax::ops::Attention {
  ax::ops::AttentionResult run_forward(const ax::ops::AttentionArgs&) override { throw std::logic_error("must not run"); }
  ax::ops::AttentionGrads run_backward(const ax::ops::AttentionArgs&, const ax::ops::AttentionBackwardArgs&) override {
    throw std::logic_error("must not run");
  }
};
}  // namespace

TEST_CASE("gpt_oss: sinks are only handed to attention backends claiming the 'sinks' layout") {
  ax::Registry reg;
  ax::register_builtins(reg);
  ax::Provider p;
  p.info.kind = ax::ProviderKind::kernel;
  p.info.op = ax::ops::Attention::kOp;
  p.info.name = "plain_only";
  p.info.needs.layouts = {"plain"};
  p.object = std::shared_ptr<ax::ops::Attention>(std::make_shared<PlainOnlyAttention>());
  reg.add(std::move(p));
  ax::KernelPreferences prefs;
  prefs.prefer["attention"] = {"plain_only", "reference"};
  ax::KernelSet ks(reg, prefs, ax::DeviceInfo{});
  // A plain call may take the preferred backend; a sinks call moves on to one that claims them.
  CHECK(ks.get<ax::ops::Attention>("fp32", "", "plain") == reg.kernel<ax::ops::Attention>("plain_only"));
  CHECK(ks.get<ax::ops::Attention>("fp32", "", "sinks") == reg.kernel<ax::ops::Attention>("reference"));
}
