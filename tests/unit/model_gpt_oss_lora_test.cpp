// gpt_oss expert LoRA against transformers + peft (scripts/goldens/make_gpt_oss_expert_lora_goldens.py, fp32 CPU):
// peft's target_parameters adapter on GptOssExperts.gate_up_proj / down_proj (interleaved gate/up, biases, the
// clamped GLU) loads here and gives peft's logits, loss, aux loss and LoRA gradients, on the dense base and on the
// MXFP4 base kept packed; merge-lora writes what peft's merge_and_unload makes; the targets name the experts as
// peft names them. axengine's own adapters loading in peft: peft_export_test.cpp + tests/python/check_peft_adapters.py.
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/lora.hpp"
#include "models/lora_all_linear.hpp"
#include "models/register.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using ax::test::case_dir;

namespace {

std::unique_ptr<ax::Registry> registry(const std::string& backends) {
  auto reg = std::make_unique<ax::Registry>();
  if (backends == "naive") {
    ax::test::add_naive_backends(*reg);
    ax::models::register_builtin_models(*reg);
  } else {
    ax::register_builtins(*reg);
  }
  return reg;
}

std::unique_ptr<ax::Model> load(const ax::Registry& reg, const fs::path& dir, const std::string& adapter) {
  ax::ModelLoadOptions o;
  o.dir = dir.string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  o.adapter_dir = adapter;
  return ax::load_model(reg, o);
}

double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}
double rel_norm(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-12, b.norm().item<double>());
}

void check_parity(const std::string& name, const std::string& backends) {
  CAPTURE(name);
  CAPTURE(backends);
  auto reg = registry(backends);
  auto model = load(*reg, case_dir(name), (case_dir(name) / "expert_adapter").string());
  auto* dm = dynamic_cast<ax::models::DecoderModel*>(model.get());
  REQUIRE(dm);
  if (name == "gpt_oss_mxfp4") {  // the base stays packed under the LoRA: 2 layers × (gate_up 3·64·32 + down 3·32·32)
    CHECK(model->weight_stats().format == "mxfp4");
    CHECK(model->weight_stats().packed_params == 2 * (3 * 64 * 32 + 3 * 32 * 32));
  }
  auto g = ax::safetensors::File::open((case_dir(name) / "expert_golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  b.labels = g->get("labels");
  auto out = model->forward(b, true);
  CHECK(rel_max(out.logits, g->get("logits")) <= 1e-4);
  CHECK(std::abs(out.loss.item<double>() - g->get("loss").item<double>()) <= 1e-5 * std::max(1.0, out.loss.item<double>()));
  REQUIRE(out.aux_loss.defined());
  CHECK(std::abs(out.aux_loss.item<double>() - g->get("aux_loss").item<double>()) <= 1e-5);
  out.loss.backward();
  int checked = 0, experts = 0;
  for (const auto& m : dm->lora().modules) {
    CAPTURE(m.site.path);
    at::Tensor ga = m.a.grad(), gb = m.b.grad();
    REQUIRE(ga.defined());
    REQUIRE(gb.defined());
    if (m.site.experts) {  // to peft's lora_B column order (j·E + e)
      const int64_t E = m.site.num_experts;
      gb = gb.view({gb.size(0), E, m.r}).permute({0, 2, 1}).reshape({gb.size(0), m.r * E});
      ++experts;
    }
    CHECK(rel_norm(ga, g->get("grad." + m.peft_key + ".lora_A.weight")) <= 1e-4);
    CHECK(rel_norm(gb, g->get("grad." + m.peft_key + ".lora_B.weight")) <= 1e-4);
    checked += 2;
  }
  CHECK(experts == 2 * 2);  // gate_up_proj and down_proj of both layers
  int golden_grads = 0;
  for (const auto& t : g->tensors()) golden_grads += t.name.rfind("grad.", 0) == 0;
  CHECK(checked == golden_grads);  // every factor peft trained is one we trained
}

}  // namespace

TEST_CASE("gpt_oss expert LoRA: peft's target_parameters adapter gives transformers+peft's logits, loss, aux loss and LoRA grads (dense base)") {
  check_parity("gpt_oss", "reference");
  check_parity("gpt_oss", "naive");
}

TEST_CASE("gpt_oss expert LoRA: on the MXFP4 base kept packed, peft's adapter gives its logits, loss, aux loss and LoRA grads on the dequantised base") {
  check_parity("gpt_oss_mxfp4", "reference");
}

TEST_CASE("gpt_oss expert LoRA: merge-lora writes peft's merge_and_unload (dense base; MXFP4 base dequantised as transformers does)") {
  auto reg = registry("reference");
  for (const std::string name : {"gpt_oss", "gpt_oss_mxfp4"}) {
    CAPTURE(name);
    const fs::path out = ax::test::scratch_dir("gpt_oss_expert_merge_" + name);
    ax::merge_lora_dir(*reg, case_dir(name).string(), (case_dir(name) / "expert_adapter").string(), (out / "merged").string(), "fp32");
    auto g = ax::safetensors::File::open((case_dir(name) / "expert_golden.safetensors").string());
    auto merged = ax::safetensors::File::open((out / "merged" / "model.safetensors").string());
    int matrices = 0;
    for (const auto& t : g->tensors()) {
      if (t.name.rfind("merged.", 0) != 0) continue;
      const std::string key = t.name.substr(7);  // model.layers.N.mlp.experts.{gate_up,down}_proj, [E, in, out]
      CAPTURE(key);
      REQUIRE(merged->find(key));
      CHECK(merged->get(key).sizes() == g->get(t.name).sizes());
      CHECK(rel_max(merged->get(key), g->get(t.name)) <= 1e-6);
      CHECK(!merged->find(key + "_blocks"));  // written dense
      ++matrices;
    }
    CHECK(matrices == 4);
    auto m = load(*reg, out / "merged", "");
    CHECK(m->weight_stats().packed_params == 0);
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    CHECK(rel_max(m->forward(b, true).logits, g->get("merged_logits")) <= 1e-4);
    ax::test::remove_tree(out);
  }
}

TEST_CASE("gpt_oss expert LoRA: lora.targets names the experts as peft does; all-linear leaves them, as peft's does") {
  const ax::models::HfConfig cfg = ax::models::parse_hf_config(ax::test::config_of("gpt_oss"), "gpt_oss/config.json");
  const auto sites = ax::models::lora_sites(cfg);
  auto plan = [&](std::vector<std::string> targets, double dropout = 0) {
    ax::LoraSpec spec;
    spec.targets = std::move(targets);
    spec.r = 2;
    spec.alpha = 4;
    spec.dropout = dropout;
    std::vector<std::string> paths;
    for (const auto& p : ax::models::plan_lora(spec, "gpt_oss", sites)) {
      CHECK(p.r == 2);  // no rank doubling: gpt_oss's experts were never per-expert nn.Linear modules
      paths.push_back(p.site.path);
    }
    return paths;
  };
  // E = 3, H = 16, I = 6: in/out features as peft's ParamWrapper has them (gate_up: H → 2I, down: I → H).
  for (const auto& s : sites)
    if (s.experts) {
      CHECK(s.num_experts == 3);
      CHECK((s.leaf == "gate_up_proj" ? std::pair{s.in_features, s.out_features} == std::pair<int64_t, int64_t>{16, 12}
                                      : std::pair{s.in_features, s.out_features} == std::pair<int64_t, int64_t>{6, 16}));
    }
  const std::vector<std::string> both = {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
                                         "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"};
  CHECK(plan({"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}) == both);
  CHECK(plan({"gate_up_proj", "experts.down_proj"}) == both);
  CHECK(plan({"down_proj"}) == std::vector<std::string>{both[1], both[3]});
  CHECK_THROWS_WITH_AS(plan({"q_proj", "gate_up_proj"}, 0.05), doctest::Contains("dropout 0.05 is not supported on expert weights"),
                       ax::UsageError);
  CHECK_THROWS_WITH_AS(plan({"gate_proj"}), doctest::Contains("matches no module"), ax::UsageError);
  // peft's all-linear on gpt_oss: the attention projections only, nothing refused (no router LoRA asked for).
  const auto all = ax::models::resolve_all_linear("gpt_oss", sites);
  CHECK(all.targets == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"});
  CHECK(all.not_supported.empty());
}
