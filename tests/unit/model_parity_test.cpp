// Model parity against HF transformers + peft (goldens from scripts/goldens/make_model_goldens.py, fp32 CPU):
// logits, loss, router aux loss and every LoRA factor's gradient, for each family and odd sizes. The
// adapter is the one peft saved, so this also covers loading PEFT adapters (fused-expert ParamWrapper keys
// included).
#include <doctest/doctest.h>

#include <filesystem>

#include <ATen/ATen.h>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/register.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

struct Loaded {
  std::unique_ptr<ax::Registry> registry;
  std::unique_ptr<ax::Model> model;
};

// backends: "reference" (core's built-ins, as a run gets them) or "naive" (tests/unit/model_test_backends.hpp).
Loaded load_case(const std::string& name, const std::string& backends, bool with_adapter = true) {
  Loaded l;
  l.registry = std::make_unique<ax::Registry>();
  if (backends == "naive") {
    ax::test::add_naive_backends(*l.registry);
    ax::models::register_builtin_models(*l.registry);
  } else {
    ax::register_builtins(*l.registry);
  }
  ax::ModelLoadOptions o;
  o.dir = (fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name).string();
  o.kernels = std::make_shared<ax::KernelSet>(*l.registry, ax::KernelPreferences{}, ax::DeviceInfo{});
  if (with_adapter) o.adapter_dir = o.dir + "/adapter";
  l.model = ax::load_model(*l.registry, o);
  return l;
}

double rel_max(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}
double rel_norm(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-12, b.norm().item<double>());
}

void check_case(const std::string& name, const std::string& backends) {
  CAPTURE(name);
  CAPTURE(backends);
  auto l = load_case(name, backends);
  auto golden = ax::safetensors::File::open(
      (fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  b.labels = golden->get("labels");
  auto out = l.model->forward(b, true);
  CHECK(rel_max(out.logits, golden->get("logits")) <= 1e-4);
  CHECK(std::abs(out.loss.item<double>() - golden->get("loss").item<double>()) <= 1e-5 * std::max(1.0, out.loss.item<double>()));
  if (golden->find("aux_loss")) {
    REQUIRE(out.aux_loss.defined());
    CHECK(std::abs(out.aux_loss.item<double>() - golden->get("aux_loss").item<double>()) <= 1e-5);
  }
  out.loss.backward();
  auto* dm = dynamic_cast<ax::models::DecoderModel*>(l.model.get());
  REQUIRE(dm);
  int checked = 0;
  for (const auto& m : dm->lora().modules) {
    CAPTURE(m.site.path);
    at::Tensor ga = m.a.grad(), gb = m.b.grad();
    REQUIRE(ga.defined());
    REQUIRE(gb.defined());
    if (m.site.experts) {  // to peft's lora_B column order (j·E + e)
      const int64_t E = m.site.num_experts;
      gb = gb.view({gb.size(0), E, m.r}).permute({0, 2, 1}).reshape({gb.size(0), m.r * E});
    }
    CHECK(rel_norm(ga, golden->get("grad." + m.peft_key + ".lora_A.weight")) <= 1e-4);
    CHECK(rel_norm(gb, golden->get("grad." + m.peft_key + ".lora_B.weight")) <= 1e-4);
    checked += 2;
  }
  // Every LoRA factor peft trained is one we trained.
  int golden_grads = 0;
  for (const auto& t : golden->tensors()) golden_grads += t.name.rfind("grad.", 0) == 0;
  CHECK(checked == golden_grads);

  // The training path: no logits wanted, so lm_head and the loss are one linear_ce call. The same loss as
  // the logits path above to fp32 rounding, and the same LoRA gradients.
  std::vector<at::Tensor> first;
  for (const auto& m : dm->lora().modules)
    for (const at::Tensor* t : {&m.a, &m.b}) {
      first.push_back(t->grad().clone());
      t->mutable_grad() = at::Tensor();
    }
  auto fused = l.model->forward(b, false);
  CHECK_FALSE(fused.logits.defined());
  const double l0 = out.loss.item<double>(), l1 = fused.loss.item<double>();
  CHECK(std::abs(l1 - l0) <= 1e-6 * std::max(1.0, std::abs(l0)));
  fused.loss.backward();
  std::size_t k = 0;
  for (const auto& m : dm->lora().modules)
    for (const at::Tensor* t : {&m.a, &m.b}) {
      CAPTURE(m.site.path);
      REQUIRE(t->grad().defined());
      CHECK(rel_norm(t->grad(), first[k++]) <= 1e-5);
    }
}

}  // namespace

TEST_CASE("model parity: llama (GQA, head_dim != hidden/heads, llama3 rope, tied, bias) vs transformers+peft") {
  check_case("llama", "reference");
  check_case("llama", "naive");
}
TEST_CASE("model parity: qwen2 (q/k/v bias, sliding window on layers from max_window_layers, tied) vs transformers+peft") {
  check_case("qwen2", "reference");
  check_case("qwen2", "naive");
}
TEST_CASE("model parity: mistral (sliding window on every layer, head_dim != hidden/heads) vs transformers+peft") {
  check_case("mistral", "reference");
  check_case("mistral", "naive");
}
TEST_CASE("model parity: gemma3_text (1+w sandwich norms, local/global RoPE, query scale, embed scale, tied) vs transformers+peft") {
  check_case("gemma3", "reference");
  check_case("gemma3", "naive");
}
TEST_CASE("model parity: olmoe (q/k norm over all heads, clip_qkv, top-2 of 5 experts not renormalised, aux loss) vs transformers+peft") {
  check_case("olmoe", "reference");
  check_case("olmoe", "naive");
}
TEST_CASE("model parity: qwen3 (q/k norm, one kv head) vs transformers+peft") {
  check_case("qwen3", "reference");
  check_case("qwen3", "naive");
}
TEST_CASE("model parity: qwen3 with YaRN RoPE (correction ramp, attention factor) vs transformers+peft") {
  check_case("qwen3_yarn", "reference");
  check_case("qwen3_yarn", "naive");
}
TEST_CASE("model parity: llama with dynamic NTK RoPE beyond max_position_embeddings vs transformers+peft") {
  check_case("llama_dynamic", "reference");
  check_case("llama_dynamic", "naive");
}
TEST_CASE("model parity: qwen3_moe (5 experts top-3, mlp_only_layers, aux loss) vs transformers+peft") {
  check_case("qwen3_moe", "reference");
  check_case("qwen3_moe", "naive");
}
TEST_CASE("model parity: qwen3_moe top-1, decoder_sparse_step 2 vs transformers+peft") {
  check_case("qwen3_moe_top1", "reference");
  check_case("qwen3_moe_top1", "naive");
}
TEST_CASE("model parity: mixtral (per-expert w1/w2/w3 checkpoint, top-2) vs transformers+peft") {
  check_case("mixtral", "reference");
  check_case("mixtral", "naive");
}

TEST_CASE("model parity: gpt_oss (sinks, sliding/full layers, yarn, biases, clamped GLU experts, aux loss) vs transformers+peft") {
  check_case("gpt_oss", "reference");
  check_case("gpt_oss", "naive");
}
TEST_CASE("model parity: qwen3_5 (Gated DeltaNet + gated attention, partial RoPE, 1+w norms, LoRA on linear_attn) vs transformers+peft") {
  check_case("qwen3_5", "reference");
  check_case("qwen3_5", "naive");
}
TEST_CASE("model parity: qwen3_5_moe (routed experts + sigmoid-gated shared expert, per-expert checkpoint, LoRA on experts by target_parameters) vs transformers+peft") {
  check_case("qwen3_5_moe", "reference");
  check_case("qwen3_5_moe", "naive");
}
TEST_CASE("model parity: qwen3_next (fused in_proj_qkvz / in_proj_ba per key head, dense layer among sparse ones, norm_topk_prob off, peft-converted expert targets) vs transformers+peft") {
  check_case("qwen3_next", "reference");
  check_case("qwen3_next", "naive");
}

// glm4_moe / deepseek_v3 (scripts/goldens/make_deepseek_glm_goldens.py): the group-limited sigmoid router with a
// random e_score_correction_bias that changes the choice, shared experts, dense first layers; LoRA on the routed
// experts through peft's MoE conversion of gate_proj / up_proj / down_proj.
TEST_CASE("model parity: glm4_moe (partial RoPE, q/k/v bias, group router with correction bias, shared experts, dense layer 0) vs transformers+peft") {
  for (const char* name : {"glm4_moe", "glm4_moe_qknorm"}) {
    check_case(name, "reference");
    check_case(name, "naive");
  }
}
TEST_CASE("model parity: deepseek_v3 (MLA with q LoRA or q_proj, interleaved or rotate-half RoPE, YaRN mscale, group router, shared experts) vs transformers+peft") {
  for (const char* name : {"deepseek_v3", "deepseek_v3_qproj"}) {
    check_case(name, "reference");
    check_case(name, "naive");
  }
}
TEST_CASE("model parity: qwen3_5's multimodal checkpoint (text_config, model.language_model.*, the tower unread), peft's adapter on it") {
  check_case("qwen3_5_vl", "reference");
}
TEST_CASE("model parity: qwen3_5_moe's multimodal checkpoint (Qwen3_5MoeForConditionalGeneration: model.language_model.* with per-expert experts, the tower unread), peft's adapter on it") {
  check_case("qwen3_5_moe_vl", "reference");
}

// A config that ties the head to the embeddings (tie_word_embeddings true; gemma3_stored_head leaves the key out,
// Gemma3TextConfig's default) over a checkpoint that stores its own, different lm_head.weight: transformers keeps
// the stored head, untied (the goldens were computed by the model transformers loaded from these very dirs).
TEST_CASE("model parity: a tied config over a stored, different lm_head keeps the stored head (qwen2; gemma3_text by its default) vs transformers+peft") {
  for (const char* name : {"qwen2_stored_head", "gemma3_stored_head"}) {
    check_case(name, "reference");
    check_case(name, "naive");
    auto l = load_case(name, "reference", false);
    CHECK_FALSE(dynamic_cast<ax::models::DecoderModel&>(*l.model).config().tie_word_embeddings);
    // inspect says so, and lists the head as used.
    const std::string report = ax::inspect_model_dir((fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name).string());
    CHECK(report.find("untied head: tie_word_embeddings is true but the checkpoint's own lm_head.weight differs") != std::string::npos);
    CHECK(report.find(", tied embeddings") == std::string::npos);
    const auto line = report.find("  lm_head.weight  ");
    REQUIRE(line != std::string::npos);
    CHECK(report.substr(line, report.find('\n', line) - line).find("(not used)") == std::string::npos);
  }
}

// merge-lora writes every tensor the model uses: the kept head too, and a config that says it is not tied.
TEST_CASE("merge-lora: a model keeping its stored head is merged with that head and gives transformers' logits") {
  ax::Registry reg;
  ax::register_builtins(reg);
  for (const char* name : {"qwen2_stored_head", "gemma3_stored_head"}) {
    CAPTURE(name);
    const fs::path base = fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name;
    const fs::path out = ax::test::scratch_dir(std::string("merge_") + name) / "merged";
    ax::merge_lora_dir(reg, base.string(), (base / "adapter").string(), out.string(), "");
    auto merged = ax::safetensors::Checkpoint::open_dir(out.string());
    REQUIRE(merged.has("lm_head.weight"));
    CHECK(at::equal(merged.get("lm_head.weight"), ax::safetensors::Checkpoint::open_dir(base.string()).get("lm_head.weight")));
    CHECK(ax::models::read_json_file((out / "config.json").string())["tie_word_embeddings"] == false);
    ax::ModelLoadOptions o;
    o.dir = out.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    auto model = ax::load_model(reg, o);
    auto golden = ax::safetensors::File::open((base / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = golden->get("input_ids");
    CHECK(rel_max(model->forward(b, true).logits, golden->get("logits")) <= 1e-4);
    ax::test::remove_tree(out.parent_path());
  }
}

// The same rule for families whose committed checkpoints store an untied head: tie_word_embeddings set to true in
// their config changes nothing, as in transformers (the two stored tensors differ, so the stored head stays).
TEST_CASE("model: tie_word_embeddings true over a stored, different lm_head gives the untied model's logits (olmoe, mixtral, qwen3_moe)") {
  for (const char* name : {"olmoe", "mixtral", "qwen3_moe"}) {
    CAPTURE(name);
    auto golden = ax::safetensors::File::open((fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = golden->get("input_ids");
    at::Tensor untied = load_case(name, "reference", false).model->forward(b, true).logits;
    nlohmann::json cfg = ax::test::config_of(name);
    cfg["tie_word_embeddings"] = true;
    ax::test::EditedModel tied(name, cfg, std::string("tied_") + name);
    ax::Registry reg;
    ax::register_builtins(reg);
    ax::ModelLoadOptions o;
    o.dir = tied.dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    auto model = ax::load_model(reg, o);
    CHECK_FALSE(dynamic_cast<ax::models::DecoderModel&>(*model).config().tie_word_embeddings);
    CHECK(at::equal(model->forward(b, true).logits, untied));
  }
}

TEST_CASE("model: shape disagreeing with config.json names the tensor") {
  auto d = ax::test::scratch_dir("badshape");
  fs::path src = fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "qwen3";
  fs::copy_file(src / "config.json", d / "config.json");
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& n : ckpt.names()) ts.emplace_back(n, n == "model.layers.1.self_attn.k_proj.weight" ? at::zeros({3, 3}) : ckpt.get(n));
  ax::safetensors::save((d / "model.safetensors").string(), ts);
  ax::Registry reg;
  ax::test::add_naive_backends(reg);
  ax::models::register_builtin_models(reg);
  ax::ModelLoadOptions o;
  o.dir = d.string();
  o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  CHECK_THROWS_WITH_AS(ax::load_model(reg, o), doctest::Contains("'model.layers.1.self_attn.k_proj.weight' has shape [3, 3]"),
                       ax::UsageError);
  ts.clear();
  for (const auto& n : ckpt.names())
    if (n != "model.norm.weight") ts.emplace_back(n, ckpt.get(n));
  ax::safetensors::save((d / "model.safetensors").string(), ts);
  CHECK_THROWS_WITH_AS(ax::load_model(reg, o), doctest::Contains("missing tensor"), ax::UsageError);
  ax::test::remove_tree(d);
}
