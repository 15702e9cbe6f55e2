// LoRA on the vision side (lora.vision_targets: LoraSpec::vision_targets, models/vision_lora.hpp) of qwen3_vl and gemma3 multimodal against
// transformers + peft (goldens: scripts/goldens/make_vlm_vision_lora_goldens.py, fp32 CPU): peft's adapter on the
// language model and the tower (vision_adapter/) loads here with the peer's logits, loss and every LoRA gradient,
// vision factors included, on the packed samples of the families' parity tests; adapters we save name the modules
// so that peft wraps exactly ours (tests/python/check_vlm_peft.py loads them in peft: CTest
// peft_loads_axengine_vision_lora_adapters_*); merge-lora folds the tower's adapters into its weights; bad targets
// are refused naming them.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/strings.hpp"
#include "models/vlm.hpp"
#include "unit/model_case_util.hpp"
#include "unit/test_paths.hpp"
#include "unit/vl_case_util.hpp"

namespace fs = std::filesystem;
using namespace ax::test::vl;

namespace {

struct Case {
  std::string name;           // tests/data/models/<name>
  int extra_padding;          // row length beyond the longest row (gemma3's parity test pads 3)
  int text_factors, vision_factors;  // of peft's vision_adapter
};
const Case kQwen3Vl{"qwen3_vl", -1, 3 * 7 * 2, (3 * 4 + 3 * 2) * 2};  // blocks' qkv/proj/fc1/fc2; merger + 2 deepstack mergers' fc1/fc2
const Case kGemma3{"gemma3_mm", 3, 3 * 7 * 2, 2 * 6 * 2};             // SigLIP's q/k/v/out_proj, fc1, fc2 on 2 layers

std::string dir_of(const Case& c) { return ax::test::case_dir(c.name).string(); }
std::shared_ptr<ax::safetensors::File> base_golden(const Case& c) { return ax::safetensors::File::open(dir_of(c) + "/golden.safetensors"); }
std::shared_ptr<ax::safetensors::File> vision_golden(const Case& c) {
  return ax::safetensors::File::open(dir_of(c) + "/vision_golden.safetensors");
}

Packed packed_of(const Case& c, const ax::safetensors::File& g) {
  if (c.extra_padding < 0) return packed_batch(g);
  const int64_t n0 = g.get("ids.0").size(0), n1 = g.get("ids.1").size(0), n2 = g.get("ids.2").size(0);
  return packed_batch(g, std::max(n0, n1 + n2) + c.extra_padding);
}

std::vector<ax::models::LoraModule> all_modules(const ax::models::VlModel& vl) {
  std::vector<ax::models::LoraModule> out = vl.text().lora().modules;
  for (const auto& m : vl.vision_lora().lora().modules) out.push_back(m);
  return out;
}

void check_vision_parity(const Case& c, const std::string& backends) {
  CAPTURE(c.name);
  CAPTURE(backends);
  auto g = vision_golden(c);
  Packed p = packed_of(c, *base_golden(c));
  auto l = load(dir_of(c), backends, dir_of(c) + "/vision_adapter");
  auto& vl = l.as<ax::models::VlModel>();
  CHECK(vl.text().lora().modules.size() * 2 == static_cast<std::size_t>(c.text_factors));
  CHECK(vl.vision_lora().lora().modules.size() * 2 == static_cast<std::size_t>(c.vision_factors));
  CHECK(l.model->trainable_parameters().size() == static_cast<std::size_t>(c.text_factors + c.vision_factors));
  l.model->set_training(true);
  auto out = l.model->forward(p.batch, true);
  check_logits(out.logits, p, *g);
  CHECK(check_loss_and_grads(out, all_modules(vl), *g) == c.text_factors + c.vision_factors);
}

// A new adapter on the language model and the tower, B random: saved, its config names the modules as peft must
// select them (target_modules, exclude_modules), reloaded with the same logits. With AXENGINE_VLM_PEFT_EXPORT_DIR
// set, left there for tests/python/check_vlm_peft.py (as check_adapter_round_trip does).
void check_vision_round_trip(const Case& c, const std::vector<std::string>& vision_targets, const std::vector<std::string>& want_names,
                             const nlohmann::json& want_exclude, const std::string& want_key) {
  CAPTURE(c.name);
  auto g = base_golden(c);
  Packed p = packed_of(c, *g);
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "v_proj", "down_proj"};
  spec.vision_targets = vision_targets;
  spec.r = 3;
  spec.alpha = 7;
  spec.seed = 5;
  auto l = load(dir_of(c), "reference", "", spec);
  auto& vl = l.as<ax::models::VlModel>();
  REQUIRE_FALSE(vl.vision_lora().empty());
  for (const auto& m : all_modules(vl)) {  // B random, so the adapter changes the logits
    at::NoGradGuard ng;
    m.b.copy_(at::randn_like(m.b) * 0.3);
  }
  at::Tensor logits = l.model->forward(p.batch, true).logits.detach();
  const char* env = std::getenv("AXENGINE_VLM_PEFT_EXPORT_DIR");
  fs::path out = env ? fs::path(env) : ax::test::scratch_dir(c.name + "_vision_adapter");
  l.model->save_adapter((out / "adapter").string());
  auto cfg = ax::models::read_json_file((out / "adapter" / "adapter_config.json").string());
  CHECK(cfg["target_modules"] == nlohmann::json(want_names));
  CHECK(cfg["exclude_modules"] == want_exclude);
  auto st = ax::safetensors::File::open((out / "adapter" / "adapter_model.safetensors").string());
  CHECK(st->find(want_key) != nullptr);
  CHECK(st->tensors().size() == all_modules(vl).size() * 2);
  auto again = load(dir_of(c), "reference", (out / "adapter").string());
  CHECK(again.as<ax::models::VlModel>().vision_lora().lora().modules.size() == vl.vision_lora().lora().modules.size());
  // Exact round trip (every factor bit for bit), logits to fp32 rounding: vl_case_util.hpp's check_adapter_round_trip
  // says why not bitwise (CI's MKL gave 6.1e-6 on gemma3's text-only adapter).
  const auto before = all_modules(vl);
  const auto after = all_modules(again.as<ax::models::VlModel>());
  REQUIRE(before.size() == after.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    CHECK(at::equal(after[i].a, before[i].a));
    CHECK(at::equal(after[i].b, before[i].b));
  }
  CHECK(rel_max(again.model->forward(p.batch, true).logits, logits) <= 5e-5);
  if (!env) {
    ax::test::remove_tree(out);
    return;
  }
  export_for_peft(out, dir_of(c), p, *g, logits);
}

// merge-lora with peft's vision adapter: the tower's adapted weights change (and only they), the merged model's
// logits are the peer's with the adapter (≤ 1e-4, as the parity) and ours (≤ 1e-5).
void check_vision_merge(const Case& c) {
  CAPTURE(c.name);
  auto g = vision_golden(c);
  Packed p = packed_of(c, *base_golden(c));
  auto ours = load(dir_of(c), "reference", dir_of(c) + "/vision_adapter");
  const auto& vl = ours.as<ax::models::VlModel>();
  fs::path out = ax::test::scratch_dir(c.name + "_vision_merged");
  fs::remove_all(out);
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::merge_lora_dir(registry, dir_of(c), dir_of(c) + "/vision_adapter", out.string(), "", std::nullopt);
  auto base = ax::safetensors::Checkpoint::open_dir(dir_of(c));
  auto written = ax::safetensors::Checkpoint::open_dir(out.string());
  std::size_t changed = 0, vision = 0;
  for (const auto& n : base.names())
    if (vl.description().vision_name(n)) {
      ++vision;
      changed += !at::equal(base.get(n), written.get(n));
    }
  CHECK(vision > 10);
  CHECK(changed == vl.vision_lora().lora().modules.size());
  const at::Tensor adapter_logits = ours.model->forward(p.batch, true).logits;
  const at::Tensor merged = load(out.string(), "reference", "").model->forward(p.batch, true).logits;
  check_logits(merged, p, *g);
  CHECK(rel_max(merged, adapter_logits) <= 1e-5);
  ax::test::remove_tree(out);
}

std::string load_error(const std::string& dir, const ax::LoraSpec& spec) {
  try {
    load(dir, "reference", "", spec);
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST_CASE("qwen3_vl vision LoRA parity: peft's adapter on the language model and the tower (qkv / proj / MLP / mergers) vs transformers+peft") {
  check_vision_parity(kQwen3Vl, "reference");
  check_vision_parity(kQwen3Vl, "naive");
}

TEST_CASE("gemma3 vision LoRA parity: peft's adapter on the language model and SigLIP (q/k/v/out_proj / fc1 / fc2) vs transformers+peft") {
  check_vision_parity(kGemma3, "reference");
  check_vision_parity(kGemma3, "naive");
}

TEST_CASE("qwen3_vl vision LoRA: adapters we save name the tower's modules for peft and reload") {
  // attn.proj (not patch_embed.proj) and the blocks' MLP only (mlp.linear_fc2: not the mergers'): nothing to exclude.
  check_vision_round_trip(kQwen3Vl, {"attn.proj", "mlp.linear_fc2"}, {"attn.proj", "down_proj", "mlp.linear_fc2", "q_proj", "v_proj"}, nullptr,
                          "base_model.model.model.visual.blocks.2.mlp.linear_fc2.lora_B.weight");
}

TEST_CASE("gemma3 vision LoRA: adapters we save name the tower's modules for peft and reload") {
  // q_proj / v_proj (the language model's) also select SigLIP's, k_proj (the tower's) the language model's: excluded.
  check_vision_round_trip(kGemma3, {"k_proj", "fc1"}, {"down_proj", "fc1", "k_proj", "q_proj", "v_proj"},
                          "model\\.language_model\\.layers\\.\\d+\\.self_attn\\.k_proj|"
                          "model\\.vision_tower\\.encoder\\.layers\\.\\d+\\.self_attn\\.q_proj|"
                          "model\\.vision_tower\\.encoder\\.layers\\.\\d+\\.self_attn\\.v_proj",
                          "base_model.model.model.vision_tower.encoder.layers.1.self_attn.k_proj.lora_A.weight");
}

TEST_CASE("vision LoRA merge-lora: the tower's adapters folded into its weights (qwen3_vl and gemma3)") {
  check_vision_merge(kQwen3Vl);
  check_vision_merge(kGemma3);
}

TEST_CASE("vision LoRA: targets that name no linear layer of the vision side or a family without one are refused") {
  ax::LoraSpec spec;
  auto refused = [&](const std::string& dir, std::vector<std::string> vision, const std::string& want) {
    CAPTURE(dir);
    CAPTURE(want);
    spec.targets = {"q_proj"};
    spec.vision_targets = vision;
    const std::string err = load_error(dir, spec);
    CAPTURE(err);
    CHECK(err.find(want) != std::string::npos);
  };
  const std::string qwen3_vl = dir_of(kQwen3Vl), gemma3 = dir_of(kGemma3);
  refused(gemma3, {"qkv"}, "vision target 'qkv' names no linear layer of the gemma3 vision tower or projector");
  refused(gemma3, {"multi_modal_projector"}, "vision target 'multi_modal_projector' names no linear layer");
  refused(qwen3_vl, {"fc1"}, "vision target 'fc1' names no linear layer of the qwen3_vl vision tower");
  refused(qwen3_vl, {"proj"}, "vision target 'proj' also names visual.patch_embed.proj, which is not a linear layer");
  refused(ax::test::case_dir("qwen2_5_vl").string(), {"qkv"}, "LoRA on the vision tower is not implemented for qwen2_5_vl");
  refused(ax::test::case_dir("qwen3").string(), {"qkv"}, "this qwen3 model has no vision side");
  // lora.targets are the language model's: a vision module there points to lora.vision_targets.
  spec.targets = {"q_proj", "qkv"};
  spec.vision_targets.clear();
  CHECK(load_error(qwen3_vl, spec).find("name the vision tower's in lora.vision_targets") != std::string::npos);
}
