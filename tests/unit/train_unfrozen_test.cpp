// [train] unfrozen_parameters (models/unfrozen.hpp, models/decoder_unfrozen.cpp): which names the patterns
// select and what they refuse; training step for step against transformers + torch.optim.AdamW (a full
// fine-tune) and peft (LoRA + lm_head as modules_to_save), goldens from scripts/goldens/make_unfreeze_goldens.py;
// the export (peft modules_to_save, or a full model directory) and merge-lora.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/decoder_checkpoint.hpp"
#include "models/hf_config.hpp"
#include "models/unfrozen.hpp"
#include "train/schedule.hpp"
#include "train/trainer.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

using Names = std::vector<std::string>;
const fs::path kDir = fs::path(AXENGINE_TEST_DATA_DIR) / "unfreeze" / "llama";

ax::models::HfConfig config_of(const fs::path& dir) {
  return ax::models::parse_hf_config(ax::models::read_json_file((dir / "config.json").string()), (dir / "config.json").string());
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

struct Run {
  ax::Registry registry;
  std::unique_ptr<ax::Model> model;
  ax::models::DecoderModel* dm = nullptr;
  Run(const fs::path& dir, std::vector<std::string> unfrozen, const std::string& adapter = "") {
    ax::register_builtins(registry);
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(registry, ax::KernelPreferences{}, ax::DeviceInfo{});
    o.adapter_dir = adapter;
    model = ax::load_model(registry, o);
    dm = dynamic_cast<ax::models::DecoderModel*>(model.get());
    REQUIRE(dm);
    dm->unfreeze(unfrozen, at::kFloat, dir.string());  // as run does after the load
  }
};

// The trainer's step (train/trainer.cpp): weight decay groups by exempt_from_weight_decay, the lr of the
// schedule, the global norm clipped to 1.0 (max / (norm + 1e-6) above it), AdamW. The golden script does the
// same with torch: cosine, lr 1e-2, 2 warmup steps of 5, min_lr_ratio 0.1, weight decay 0.1.
std::vector<double> train_five_steps(ax::Model& model, ax::Registry& registry, const ax::safetensors::File& batches) {
  auto params = model.trainable_parameters();
  ax::ParamGroup decay, no_decay;
  decay.weight_decay = 0.1;
  for (auto& [name, p] : params) (ax::train::exempt_from_weight_decay(name, p) ? no_decay : decay).params.push_back(p);
  auto provider = registry.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "adamw");
  REQUIRE(provider);
  auto opt = provider->create({decay, no_decay}, toml::table{});
  const ax::train::Schedule schedule{"cosine", 1e-2, 2, 5, 0.1};
  const at::Tensor ids = batches.get("input_ids"), labels = batches.get("labels");
  std::vector<double> losses;
  for (int64_t step = 0; step < 5; ++step) {
    ax::Batch b;
    b.input_ids = ids[step];
    b.labels = labels[step];
    at::Tensor loss = model.forward(b, false).loss;
    loss.backward();
    std::vector<at::Tensor> norms;
    for (auto& [n, p] : params) {
      CAPTURE(n);
      REQUIRE(p.grad().defined());  // every trainable tensor gets a gradient
      norms.push_back(p.grad().norm());
    }
    const double norm = at::stack(norms).norm().item<double>();
    if (norm > 1.0)
      for (auto& [n, p] : params) p.mutable_grad().mul_(1.0 / (norm + 1e-6));
    opt->step(schedule.at(step));
    opt->zero_grad();
    losses.push_back(loss.item<double>());
  }
  ax::Batch b;
  b.input_ids = ids[0];
  b.labels = labels[0];
  at::NoGradGuard no_grad;
  losses.push_back(model.forward(b, false).loss.item<double>());
  return losses;
}

double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

}  // namespace

TEST_CASE("unfrozen: patterns match as axolotl's (literal dots, anchored at the start) and name what they refuse") {
  const auto c = config_of(kDir);
  const std::map<std::string, ax::ops::WeightFormat> dense;
  auto resolve = [&](std::vector<std::string> p) { return ax::models::resolve_unfrozen(c, dense, p, {}); };
  CHECK(resolve({".*"}).size() == ax::models::internal_tensors(c).size());  // "\.*": every name
  CHECK(resolve({"^lm_head.weight$"}) == (Names{"lm_head.weight"}));
  CHECK(resolve({"model.layers.1.input_layernorm"}) == (Names{"model.layers.1.input_layernorm.weight"}));
  CHECK(resolve({"model.layers.[0-9]+.self_attn.q_proj.bias", "^model.norm"}) ==
        (Names{"model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.q_proj.bias", "model.norm.weight"}));
  // Not at the start: no match; a '.' is a dot, not any character.
  CHECK(refusal([&] { resolve({"layers.0.mlp"}); }).find("'layers.0.mlp' matches no parameter") != std::string::npos);
  CHECK(refusal([&] { resolve({"model_norm"}); }).find("'model_norm' matches no parameter") != std::string::npos);
  CHECK(refusal([&] { resolve({"^lm_head.weight$", "nothing"}); }).find("train.unfrozen_parameters: 'nothing'") != std::string::npos);
  CHECK(refusal([&] { resolve({"^model.embed_tokens.weight$[:32]"}); }).find("row range") != std::string::npos);
  CHECK(refusal([&] { resolve({"model.(layers"}); }).find("not a valid regular expression") != std::string::npos);
  // Packed: named with its format.
  std::map<std::string, ax::ops::WeightFormat> packed{{"model.layers.0.mlp.up_proj.weight", ax::ops::WeightFormat::nf4}};
  const std::string p = refusal([&] { ax::models::resolve_unfrozen(c, packed, {"model.layers.0.mlp"}, {}); });
  CHECK(p.find("'model.layers.0.mlp.up_proj.weight', which the base holds packed (nf4)") != std::string::npos);
  // A module with a LoRA adapter.
  ax::LoraSpec spec;
  spec.targets = {"v_proj"};
  const auto lora = ax::models::plan_lora(spec, c.model_type, ax::models::lora_sites(c));
  const std::string l = refusal([&] { ax::models::resolve_unfrozen(c, dense, {"model.layers.1.self_attn"}, lora); });
  CHECK(l.find("'model.layers.1.self_attn.v_proj.weight', whose module model.layers.1.self_attn.v_proj also gets a LoRA adapter") !=
        std::string::npos);
  // Fused experts: the moe.mlp op computes no weight gradient.
  const fs::path moe = fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "qwen3_moe";
  const std::string e = refusal([&] { ax::models::resolve_unfrozen(config_of(moe), dense, {"model.layers.0.mlp"}, {}); });
  CHECK(e.find("'model.layers.0.mlp.experts.gate_up_proj', a fused-experts tensor") != std::string::npos);
  CHECK(ax::models::resolve_unfrozen(config_of(moe), dense, {"model.layers.0.mlp.gate"}, {}) ==
        (Names{"model.layers.0.mlp.gate.weight"}));
}

TEST_CASE("unfrozen: plan_unfrozen (validate) refuses what the load refuses, and counts what trains") {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::ModelLoadOptions o;
  o.dir = kDir.string();
  o.kernels = std::make_shared<ax::KernelSet>(registry, ax::KernelPreferences{}, ax::DeviceInfo{});
  const auto plan = ax::models::plan_unfrozen(o, {"^lm_head.weight$", "model.norm"});
  CHECK(plan.names == (Names{"model.norm.weight", "lm_head.weight"}));
  CHECK(plan.elements == 16 + 48 * 16);
  auto load_refusal = [&](const std::vector<std::string>& patterns) {
    return refusal([&] {
      auto m = ax::load_model(registry, o);
      dynamic_cast<ax::models::DecoderModel&>(*m).unfreeze(patterns, at::kFloat, o.dir);
    });
  };
  CHECK(refusal([&] { ax::models::plan_unfrozen(o, {"^lm_head.bias"}); }).find("'^lm_head.bias' matches no parameter") != std::string::npos);
  CHECK(load_refusal({"^lm_head.bias"}).find("'^lm_head.bias' matches no parameter") != std::string::npos);
  o.weights.format = "nf4";
  o.weights.blocksize = 16;
  const std::vector<std::string> q{"model.layers.0.self_attn.q_proj"};
  CHECK(refusal([&] { ax::models::plan_unfrozen(o, q); }).find("which the base holds packed (nf4)") != std::string::npos);
  CHECK(load_refusal(q).find("which the base holds packed (nf4)") != std::string::npos);
  // With the adapter (LoRA on q_proj and v_proj): both refuse q_proj.
  o.weights = {};
  o.adapter_dir = (kDir / "adapter").string();
  CHECK(refusal([&] { ax::models::plan_unfrozen(o, q); }).find("also gets a LoRA adapter") != std::string::npos);
  CHECK(load_refusal(q).find("also gets a LoRA adapter") != std::string::npos);
}

TEST_CASE("unfrozen: a full fine-tune of a tiny llama matches transformers + torch AdamW step for step (fp32, CPU)") {
  auto golden = ax::safetensors::File::open((kDir / "golden_full.safetensors").string());
  Run r(kDir, {".*"});
  CHECK(r.dm->lora().modules.empty());
  const auto params = r.model->trainable_parameters();
  CHECK(params.size() == ax::models::internal_tensors(r.dm->config()).size());
  const std::vector<double> losses = train_five_steps(*r.model, r.registry, *golden);
  const at::Tensor want = golden->get("loss");
  for (int64_t i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(std::abs(losses[i] - want[i].item<double>()) <= 1e-5);
  }
  for (const auto& [name, p] : params) {
    CAPTURE(name);
    CHECK(rel_max(p.detach(), golden->get("final." + name)) <= 1e-5);
  }
}

TEST_CASE("unfrozen: LoRA + lm_head matches peft with modules_to_save step for step, and exports as peft does") {
  auto golden = ax::safetensors::File::open((kDir / "golden_lora_head.safetensors").string());
  auto batches = ax::safetensors::File::open((kDir / "golden_full.safetensors").string());  // the same batches
  // The adapter peft saved (its lm_head under modules_to_save), its head trained as peft trains it.
  Run r(kDir, {"^lm_head.weight$"}, (kDir / "adapter").string());
  CHECK(r.dm->lora().modules.size() == 4);
  const auto params = r.model->trainable_parameters();
  REQUIRE(params.size() == 9);
  const std::vector<double> losses = train_five_steps(*r.model, r.registry, *batches);
  const at::Tensor want = golden->get("loss");
  for (int64_t i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(std::abs(losses[i] - want[i].item<double>()) <= 1e-5);
  }
  for (const auto& [name, p] : params) {
    CAPTURE(name);
    const std::string key = name == "lm_head.weight" ? name : name + ".weight";
    CHECK(rel_max(p.detach(), golden->get("final." + key)) <= 1e-5);
  }

  // The export: the keys and modules_to_save peft wrote for the same adapter.
  const fs::path out = ax::test::scratch_dir("unfrozen_lora_head");
  r.model->save_adapter((out / "a").string());
  auto ours = ax::safetensors::File::open((out / "a" / "adapter_model.safetensors").string());
  auto peft = ax::safetensors::File::open((kDir / "adapter" / "adapter_model.safetensors").string());
  std::set<std::string> ours_keys, peft_keys;
  for (const auto& t : ours->tensors()) ours_keys.insert(t.name);
  for (const auto& t : peft->tensors()) peft_keys.insert(t.name);
  CHECK(ours_keys == peft_keys);
  const auto cfg = ax::models::read_json_file((out / "a" / "adapter_config.json").string());
  CHECK(cfg["modules_to_save"] == nlohmann::json::array({"lm_head"}));
  CHECK(at::equal(ours->get("base_model.model.lm_head.weight"), params.back().second.detach()));

  // Loaded back (no unfrozen parameters now: the head is restored, frozen): the same logits.
  ax::Batch b;
  b.input_ids = at::arange(8, at::kLong).reshape({1, 8});
  at::Tensor before;
  {
    at::NoGradGuard g;
    before = r.model->forward(b, true).logits;
  }
  Run back(kDir, {}, (out / "a").string());
  CHECK(back.model->trainable_parameters().size() == 8);
  at::NoGradGuard g;
  CHECK(rel_max(back.model->forward(b, true).logits, before) <= 1e-6);

  // merge-lora folds both: the LoRA deltas and the trained head.
  ax::merge_lora_dir(r.registry, kDir.string(), (out / "a").string(), (out / "merged").string(), "", std::nullopt);
  Run merged(out / "merged", {});
  CHECK(rel_max(merged.model->forward(b, true).logits, before) <= 1e-5);
  ax::test::remove_tree(out);
}

TEST_CASE("unfrozen: what peft cannot save as modules_to_save is written as a full model directory") {
  const fs::path out = ax::test::scratch_dir("unfrozen_full_export");
  ax::Batch b;
  b.input_ids = at::arange(10, at::kLong).reshape({2, 5});
  b.labels = b.input_ids;
  for (const auto& [what, unfrozen, adapter] :
       {std::tuple<std::string, std::vector<std::string>, std::string>{"no LoRA", {".*"}, ""},
        // k_proj.weight without its bias: not a whole module.
        {"part of a module", {"^model.layers.0.self_attn.k_proj.weight$"}, (kDir / "adapter").string()}}) {
    CAPTURE(what);
    Run r(kDir, unfrozen, adapter);
    // One step changes the trained tensors (and the adapter), so the export differs from the base.
    auto params = r.model->trainable_parameters();
    ax::ParamGroup g;
    for (auto& [n, p] : params) g.params.push_back(p);
    auto opt = r.registry.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "adamw")->create({g}, toml::table{});
    r.model->forward(b, false).loss.backward();
    opt->step(1e-2);
    const fs::path dir = out / (what == "no LoRA" ? "full" : "part");
    r.model->save_adapter(dir.string());
    CHECK(fs::exists(dir / "model.safetensors"));
    CHECK(fs::exists(dir / "config.json"));
    CHECK(!fs::exists(dir / "adapter_config.json"));
    at::NoGradGuard ng;
    const at::Tensor want = r.model->forward(b, true).logits;
    Run loaded(dir, {});
    CHECK(rel_max(loaded.model->forward(b, true).logits, want) <= 1e-6);
    CHECK(rel_max(want, Run(kDir, {}).model->forward(b, true).logits) > 1e-4);  // it did train
  }
  ax::test::remove_tree(out);
}
