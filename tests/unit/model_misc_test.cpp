// Model loading and forward details beyond the HF parity goldens: packing, dtypes, config errors, LoRA
// spec errors, init-model / inspect / merge-lora.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <sys/wait.h>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/safetensors.hpp"
#include "models/decoder.hpp"
#include "models/hf_config.hpp"
#include "models/register.hpp"
#include "unit/model_test_backends.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path case_dir(const std::string& name) { return fs::path(AXENGINE_TEST_DATA_DIR) / "models" / name; }

struct Env {
  ax::Registry reg;
  Env() {
    ax::test::add_naive_backends(reg);
    ax::models::register_builtin_models(reg);
  }
  std::unique_ptr<ax::Model> load(const fs::path& dir, const std::string& dtype = "fp32",
                                  std::optional<ax::LoraSpec> lora = std::nullopt) {
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.dtype = dtype;
    o.lora = std::move(lora);
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    return ax::load_model(reg, o);
  }
};

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("model: packed samples give the logits of separate rows; no loss across sample boundaries") {
  Env env;
  for (const char* name : {"qwen3", "mixtral"}) {
    CAPTURE(name);
    auto m = env.load(case_dir(name));
    auto g = ax::safetensors::File::open((case_dir(name) / "golden.safetensors").string());
    at::Tensor ids = g->get("input_ids");  // [2, 7]
    ax::Batch rows;
    rows.input_ids = ids;
    rows.labels = ids;
    auto sep = m->forward(rows, true);
    ax::Batch packed;
    packed.input_ids = ids.reshape({1, 14});
    packed.labels = packed.input_ids;
    packed.position_ids = at::arange(7).repeat({2}).reshape({1, 14});
    packed.cu_seqlens = at::tensor({0, 7, 14}, at::kInt);
    packed.max_seqlen = 7;
    auto pk = m->forward(packed, true);
    CHECK((pk.logits.reshape({2, 7, -1}) - sep.logits).abs().max().item<double>() <= 1e-5);
    // Same targets (6 per sample), same mean loss.
    CHECK(std::abs(pk.loss.item<double>() - sep.loss.item<double>()) <= 1e-5);
  }
}

TEST_CASE("model: bf16 and fp16 checkpoints load into the configured compute dtype") {
  Env env;
  auto d = ax::test::scratch_dir("bf16ckpt");
  for (const char* f : {"config.json"}) fs::copy_file(case_dir("qwen3") / f, d / f);
  auto ckpt = ax::safetensors::Checkpoint::open_dir(case_dir("qwen3").string());
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& n : ckpt.names()) ts.emplace_back(n, ckpt.get(n).to(at::kBFloat16));
  ax::safetensors::save((d / "model.safetensors").string(), ts);
  auto g = ax::safetensors::File::open((case_dir("qwen3") / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  at::Tensor ref = env.load(case_dir("qwen3"))->forward(b, true).logits;
  auto m32 = env.load(d, "fp32");
  at::Tensor l32 = m32->forward(b, true).logits;
  CHECK((l32.scalar_type() == at::kFloat));
  for (const auto& [n, t] : m32->named_parameters()) CHECK((t.scalar_type() == at::kFloat));
  // Only the weights' bf16 rounding differs from the fp32 model.
  double scale = ref.abs().max().item<double>();
  CHECK((l32 - ref).abs().max().item<double>() <= 0.05 * scale);
  CHECK((l32 - ref).abs().max().item<double>() > 0);
  auto m16 = env.load(d, "bf16");
  at::Tensor l16 = m16->forward(b, true).logits;
  CHECK((l16.scalar_type() == at::kBFloat16));
  CHECK((l16.to(at::kFloat) - ref).abs().max().item<double>() <= 0.1 * scale);
  CHECK_THROWS_WITH_AS(env.load(d, "int8"), doctest::Contains("dtype"), ax::UsageError);
  ax::test::remove_tree(d);
}

TEST_CASE("model: LoRA weights in fp32 or the compute dtype; only LoRA is trainable") {
  Env env;
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "down_proj"};
  spec.r = 4;
  auto m = env.load(case_dir("qwen3"), "bf16", spec);
  auto tp = m->trainable_parameters();
  CHECK(tp.size() == 8);  // 2 layers x 2 modules x (A, B)
  for (const auto& [n, t] : tp) {
    CHECK((t.scalar_type() == at::kFloat));
    CHECK(t.requires_grad());
  }
  for (const auto& [n, t] : m->named_parameters())
    if (n.find(".lora_") == std::string::npos) CHECK(!t.requires_grad());
  spec.dtype = "compute";
  for (const auto& [n, t] : env.load(case_dir("qwen3"), "bf16", spec)->trainable_parameters())
    CHECK((t.scalar_type() == at::kBFloat16));
  // B starts at zero: a fresh adapter does not change the output, but gets gradients.
  spec.dtype = "fp32";
  auto g = ax::safetensors::File::open((case_dir("qwen3") / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  b.labels = g->get("labels");
  auto m1 = env.load(case_dir("qwen3"), "fp32", spec);
  auto out = m1->forward(b, true);
  CHECK((out.logits - env.load(case_dir("qwen3"))->forward(b, true).logits).abs().max().item<double>() == 0);
  out.loss.backward();
  for (const auto& [n, t] : m1->trainable_parameters())
    if (n.find("lora_B") != std::string::npos) CHECK(t.grad().abs().sum().item<double>() > 0);
}

TEST_CASE("model: LoRA dropout acts in training mode only") {
  Env env;
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "v_proj"};
  spec.dropout = 0.5;
  auto m = env.load(case_dir("llama"), "fp32", spec);
  {
    at::NoGradGuard ng;
    for (auto& [n, t] : m->trainable_parameters())
      if (n.find("lora_B") != std::string::npos) t.normal_(0, 1);
  }
  auto g = ax::safetensors::File::open((case_dir("llama") / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  m->set_training(false);
  at::Tensor e1 = m->forward(b, true).logits, e2 = m->forward(b, true).logits;
  CHECK(at::equal(e1, e2));
  m->set_training(true);
  at::Tensor t1 = m->forward(b, true).logits;
  CHECK(!at::allclose(t1, e1));
}

TEST_CASE("model: activation checkpointing gives bitwise the same loss and LoRA gradients") {
  // Mixtral: router aux loss in the loss (its gradient reaches the hidden states through the router
  // logits, a second output of each recomputed layer); dropout: the recomputation must replay the RNG.
  Env env;
  for (const char* name : {"mixtral", "qwen3"}) {
    CAPTURE(name);
    const bool moe = std::string(name) == "mixtral";
    ax::LoraSpec spec;  // LoRA on experts takes no dropout (as peft): dropout on the dense model
    spec.targets = moe ? std::vector<std::string>{"q_proj", "v_proj", "gate_up_proj", "down_proj"}
                       : std::vector<std::string>{"q_proj", "v_proj", "gate_proj", "down_proj"};
    spec.dropout = moe ? 0.0 : 0.3;
    auto g = ax::safetensors::File::open((case_dir(name) / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    b.labels = b.input_ids;
    std::vector<std::vector<at::Tensor>> grads;
    std::vector<at::Tensor> losses;
    for (bool ckpt : {false, true}) {
      at::manual_seed(7);
      ax::ModelLoadOptions o;
      o.dir = case_dir(name).string();
      o.dtype = "fp32";
      o.lora = spec;
      o.activation_checkpointing = ckpt;
      o.kernels = std::make_shared<ax::KernelSet>(env.reg, ax::KernelPreferences{}, ax::DeviceInfo{});
      auto m = ax::load_model(env.reg, o);
      {
        at::NoGradGuard ng;
        for (auto& [n, t] : m->trainable_parameters())
          if (n.find("lora_B") != std::string::npos) t.normal_(0, 0.1);
      }
      m->set_training(true);
      auto out = m->forward(b, false);
      out.loss.backward();
      losses.push_back(out.loss.detach());
      std::vector<at::Tensor> gs;
      for (auto& [n, t] : m->trainable_parameters()) {
        REQUIRE_MESSAGE(t.grad().defined(), n);
        gs.push_back(t.grad().clone());
      }
      grads.push_back(gs);
    }
    CHECK(at::equal(losses[0], losses[1]));
    REQUIRE(grads[0].size() == grads[1].size());
    for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(at::equal(grads[0][i], grads[1][i]));
  }
}

TEST_CASE("model: bf16 through the aten backends of rms_norm, swiglu and linear_ce tracks the fp32 loss") {
  // Core's built-ins as a run gets them: fp32 resolves to `reference`, bf16 to `aten` (the production path,
  // linear_ce chunked). Dense and MoE (swiglu on the grouped gate_up output).
  for (const char* name : {"qwen3", "qwen3_moe"}) {
    CAPTURE(name);
    ax::Registry reg;
    ax::register_builtins(reg);
    auto g = ax::safetensors::File::open((case_dir(name) / "golden.safetensors").string());
    ax::Batch b;
    b.input_ids = g->get("input_ids");
    b.labels = b.input_ids;
    std::vector<double> losses;
    for (const char* dtype : {"fp32", "bf16"}) {
      ax::ModelLoadOptions o;
      o.dir = case_dir(name).string();
      o.dtype = dtype;
      ax::LoraSpec spec;
      spec.targets = {"q_proj", "v_proj"};
      o.lora = spec;
      o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
      auto m = ax::load_model(reg, o);
      auto out = m->forward(b, false);
      losses.push_back(out.loss.item<double>());
      out.loss.backward();
      for (auto& [n, t] : m->trainable_parameters()) {
        REQUIRE_MESSAGE(t.grad().defined(), n);
        CHECK_MESSAGE(at::isfinite(t.grad()).all().item<bool>(), n);
      }
      for (const auto& r : o.kernels->resolutions())
        if (r.op == "rms_norm" || r.op == "swiglu" || r.op == "linear_ce") {
          CAPTURE(r.op);
          CHECK(r.chosen == (std::string(dtype) == "bf16" ? "aten" : "reference"));
        }
    }
    CHECK(std::abs(losses[1] - losses[0]) <= 2e-2 * losses[0]);
  }
}

TEST_CASE("model: LoRA specs that cannot apply are rejected with the reason") {
  Env env;
  auto err = [&](const char* model, std::vector<std::string> targets, double dropout = 0) {
    ax::LoraSpec s;
    s.targets = std::move(targets);
    s.dropout = dropout;
    return usage_error([&] { env.load(case_dir(model), "fp32", s); });
  };
  CHECK(err("qwen3", {"q_prj"}).find("did you mean 'q_proj'") != std::string::npos);
  CHECK(err("qwen3_moe", {"gate_proj"}).find("must be given together") != std::string::npos);
  CHECK(err("mixtral", {"w1"}).find("must be given together") != std::string::npos);
  CHECK(err("mixtral", {"w2"}, 0.1).find("not supported on expert weights") != std::string::npos);
  CHECK(err("qwen3", {}).find("no target") != std::string::npos);
}

TEST_CASE("hf config: missing, ill-typed and unsupported keys name config.json and the key") {
  json good = ax::models::read_json_file((case_dir("llama") / "config.json").string());
  auto err = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    return usage_error([&] { ax::models::parse_hf_config(j, "dir/config.json"); });
  };
  CHECK(err([](json&) {}).empty());
  CHECK(err([](json& j) { j.erase("hidden_size"); }) == "dir/config.json: 'hidden_size' is missing");
  CHECK(err([](json& j) { j["num_attention_heads"] = "4"; }).find("'num_attention_heads' must be an integer") != std::string::npos);
  CHECK(err([](json& j) { j["num_key_value_heads"] = 3; }).find("does not divide") != std::string::npos);
  CHECK(err([](json& j) { j["rope_parameters"]["rope_type"] = "longrope"; }).find("'longrope' is not supported") != std::string::npos);
  CHECK(err([](json& j) { j["rope_parameters"].erase("low_freq_factor"); }).find("rope_parameters.low_freq_factor") != std::string::npos);
  CHECK(err([](json& j) { j["hidden_act"] = "gelu"; }).find("only silu") != std::string::npos);
  CHECK(err([](json& j) { j["model_type"] = "gpt2"; }).find("'gpt2'") != std::string::npos);
  // transformers 4 spellings are accepted: rope_theta + rope_scaling.type.
  json old = good;
  old.erase("rope_parameters");
  old["rope_theta"] = 5000.0;
  old["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8}};
  auto c = ax::models::parse_hf_config(old, "old");
  auto n = ax::models::parse_hf_config(good, "new");
  CHECK(at::equal(ax::models::rope_inv_freq(c), ax::models::rope_inv_freq(n)));
  CHECK(c.rope.type == "llama3");
}

TEST_CASE("load_model: unknown model_type lists the known families") {
  Env env;
  auto d = ax::test::scratch_dir("unknown_type");
  json j = ax::models::read_json_file((case_dir("llama") / "config.json").string());
  j["model_type"] = "lama";
  std::ofstream(d / "config.json") << j.dump();
  auto e = usage_error([&] { env.load(d); });
  CHECK(e.find("model_type 'lama' has no model family") != std::string::npos);
  CHECK(e.find("did you mean 'llama'") != std::string::npos);
  ax::test::remove_tree(d);
}

TEST_CASE("init-model presets load and train; inspect reports counts and targets") {
  Env env;
  for (const auto& preset : ax::model_presets()) {
    if (preset.rfind("tiny-", 0) != 0) continue;  // bench presets are GPU-sized
    CAPTURE(preset);
    auto d = ax::test::scratch_dir("init_" + preset);
    ax::init_model_dir(preset, d.string(), 1);
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      CHECK(fs::exists(d / f));
    const bool vl = preset == "tiny-qwen2_5-vl" || preset == "tiny-qwen3-vl" || preset == "tiny-qwen3-vl-moe";
    if (vl) CHECK(fs::exists(d / "preprocessor_config.json"));  // the mm_cpt processor's settings
    ax::LoraSpec spec;
    spec.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"};  // down_proj: the experts' on MoE presets
    const bool mla = preset == "tiny-deepseek-v3";  // multi-head latent attention: its own projections
    if (mla) spec.targets = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "down_proj"};
    auto m = env.load(d, "fp32", spec);
    ax::Batch b;
    b.input_ids = at::randint(0, 200, {2, 9}, at::kLong);
    b.labels = b.input_ids;
    auto out = m->forward(b, true);
    CHECK(std::isfinite(out.loss.item<double>()));
    out.loss.backward();
    std::string report = ax::inspect_model_dir(d.string());
    CHECK(report.find("parameters") != std::string::npos);
    CHECK(report.find(mla ? "q_a_proj" : "q_proj") != std::string::npos);
    // tiny-qwen3-vl(-moe) is written in transformers 5's module tree, as the hub's Qwen3-VL checkpoints are.
    const bool module_tree = preset == "tiny-qwen3-vl" || preset == "tiny-qwen3-vl-moe";
    CHECK(report.find(module_tree ? "model.language_model.embed_tokens.weight  F32" : "model.embed_tokens.weight  F32") !=
          std::string::npos);
    if (vl) CHECK(report.find("(not used)") == std::string::npos);
    ax::test::remove_tree(d);
  }
  std::string r = ax::inspect_model_dir(case_dir("qwen3_moe").string());
  // 9408 = total from the config; 2 sparse layers x 2 idle experts x 3·6·16 expert weights are inactive.
  CHECK(r.find("(9408)") != std::string::npos);
  CHECK(r.find("(8256)") != std::string::npos);
  CHECK_THROWS_WITH_AS(ax::init_model_dir("tiny-lama", "/tmp/x", 0), doctest::Contains("did you mean 'tiny-llama'"), ax::UsageError);
}

TEST_CASE("model forward: inconsistent batches are rejected, not read out of bounds") {
  Env env;
  auto m = env.load(case_dir("qwen3"));
  ax::Batch b;
  b.input_ids = at::zeros({2, 5}, at::kLong);
  b.labels = at::zeros({2, 4}, at::kLong);
  CHECK_THROWS_WITH_AS(m->forward(b, false), doctest::Contains("labels has shape"), ax::UsageError);
  b.labels = at::Tensor();
  b.cu_seqlens = at::tensor({0, 5, 9}, at::kInt);
  CHECK_THROWS_WITH_AS(m->forward(b, false), doctest::Contains("cu_seqlens"), ax::UsageError);
  b.cu_seqlens = at::Tensor();
  b.input_ids = at::full({1, 3}, 53, at::kLong);  // vocab is 53
  CHECK_THROWS_WITH_AS(m->forward(b, false), doctest::Contains("token ids must be in [0, 53)"), ax::UsageError);
}

TEST_CASE("model: a batch with no loss token has a zero loss and zero gradients") {
  // Every label -100 (or only first tokens of packed samples, which are never predicted): the mean over no
  // targets was NaN. It is 0 now and so are its LoRA gradients; a batch with targets still has its loss.
  Env env;
  ax::LoraSpec spec;
  spec.targets = {"q_proj", "v_proj"};
  auto m = env.load(case_dir("qwen3"), "fp32", spec);
  auto g = ax::safetensors::File::open((case_dir("qwen3") / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  b.labels = at::full_like(b.input_ids, -100);
  b.labels.select(1, 0).copy_(b.input_ids.select(1, 0));  // position 0 of each row: not a target either
  auto out = m->forward(b, false);
  CHECK(out.loss.item<double>() == 0.0);
  out.loss.backward();
  for (auto& [n, t] : m->trainable_parameters())
    if (t.grad().defined()) CHECK_MESSAGE(t.grad().abs().sum().item<double>() == 0.0, n);
  b.labels = b.input_ids;
  at::Tensor with_targets = m->forward(b, false).loss.detach();
  CHECK(std::isfinite(with_targets.item<double>()));
  CHECK(with_targets.item<double>() > 0.0);
}

TEST_CASE("model: a sharded checkpoint (model.safetensors.index.json) loads like the single file") {
  Env env;
  auto d = ax::test::scratch_dir("sharded");
  fs::copy_file(case_dir("qwen3_moe") / "config.json", d / "config.json");
  auto ckpt = ax::safetensors::Checkpoint::open_dir(case_dir("qwen3_moe").string());
  std::vector<std::pair<std::string, at::Tensor>> s1, s2;
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  int i = 0;
  for (const auto& n : ckpt.names()) {
    bool first = i++ % 2 == 0;
    (first ? s1 : s2).emplace_back(n, ckpt.get(n));
    index["weight_map"][n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ax::safetensors::save((d / "model-00001-of-00002.safetensors").string(), s1);
  ax::safetensors::save((d / "model-00002-of-00002.safetensors").string(), s2);
  std::ofstream(d / "model.safetensors.index.json") << index.dump();
  auto g = ax::safetensors::File::open((case_dir("qwen3_moe") / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = g->get("input_ids");
  CHECK(at::equal(env.load(d)->forward(b, true).logits, env.load(case_dir("qwen3_moe"))->forward(b, true).logits));
  ax::test::remove_tree(d);
}

TEST_CASE("CLI: init-model, inspect and merge-lora run and report bad input with exit code 2") {
  auto d = ax::test::scratch_dir("cli_models");
  const std::string bin = std::string(AXENGINE_BIN_DIR) + "/axengine";
  auto run = [&](const std::string& args) {
    int rc = std::system((bin + " " + args + " > " + (d / "out.txt").string() + " 2>&1").c_str());
    return WEXITSTATUS(rc);
  };
  auto output = [&] {
    std::ifstream in(d / "out.txt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(run("init-model --preset tiny-qwen3-moe --out " + (d / "m").string() + " --seed 2") == 0);
  CHECK(run("inspect " + (d / "m").string()) == 0);
  CHECK(output().find("qwen3_moe: 2 layers") != std::string::npos);
  CHECK(output().find("gate_up_proj (experts)") != std::string::npos);
  CHECK(run("init-model --preset tiny-gpt --out " + (d / "x").string()) == 2);
  CHECK(output().find("unknown preset 'tiny-gpt'") != std::string::npos);
  CHECK(run("inspect " + (d / "nothing").string()) == 2);
  CHECK(output().find("config.json") != std::string::npos);
  // An adapter for the new model, then merge it.
  {
    Env env;
    ax::LoraSpec spec;
    spec.targets = {"q_proj", "gate_proj", "up_proj", "down_proj"};
    env.load(d / "m", "fp32", spec)->save_adapter((d / "adapter").string());
  }
  CHECK(run("merge-lora --model " + (d / "m").string() + " --adapter " + (d / "adapter").string() + " --out " +
            (d / "merged").string() + " --dtype bf16") == 0);
  auto merged = ax::safetensors::Checkpoint::open_dir((d / "merged").string());
  CHECK((merged.info("model.embed_tokens.weight").scalar_type == at::kBFloat16));
  CHECK(merged.has("model.layers.0.mlp.experts.5.up_proj.weight"));
  CHECK(fs::exists(d / "merged" / "tokenizer.json"));
  CHECK(run("merge-lora --model " + (d / "m").string() + " --adapter " + (d / "adapter").string() + " --out " +
            (d / "merged").string()) == 2);  // output dir not empty
  CHECK(output().find("not empty") != std::string::npos);
  ax::test::remove_tree(d);
}
