// QLoRA: [model] weight_format packs the frozen projections at load, the reference backends train with the
// packed base, and the policy keys (skip_modules, quant_blocksize, double_quant) do what docs/weights.md says.
// (peft loading a QLoRA adapter: peft_export_test.cpp; the CLI run: cli cases at the end.)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include "axengine/builtins.hpp"
#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/training_record.hpp"
#include "models/weight_policy.hpp"
#include "unit/cli_util.hpp"
#include "unit/test_paths.hpp"
#include "unit/tiny_model.hpp"

namespace fs = std::filesystem;

namespace {

struct Env {
  ax::Registry reg;
  Env() { ax::register_builtins(reg); }
  std::unique_ptr<ax::Model> load(const fs::path& dir, const ax::WeightPolicy& weights, std::optional<ax::LoraSpec> lora = {},
                                   ax::KernelPreferences prefs = {}) {
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.kernels = std::make_shared<ax::KernelSet>(reg, std::move(prefs), ax::DeviceInfo{});
    o.lora = std::move(lora);
    o.weights = weights;
    return ax::load_model(reg, o);
  }
};

ax::WeightPolicy policy(const std::string& format, int64_t blocksize = 64, bool double_quant = false) {
  ax::WeightPolicy p;
  p.format = format;
  p.blocksize = blocksize;
  p.double_quant = double_quant;
  return p;
}

ax::LoraSpec all_linear_lora() {
  ax::LoraSpec s;
  s.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  s.r = 4;
  s.alpha = 8;
  s.seed = 3;
  return s;
}

ax::Batch batch(int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  ax::Batch b;
  b.input_ids = at::randint(vocab, {2, 24}, gen, at::kLong);
  b.labels = b.input_ids.clone();
  return b;
}

// The checkpoint of `src` with every tensor the QLoRA policy packs replaced by `roundtrip(tensor)`: a dense model
// of it is the packed model's exact twin.
template <class F>
void write_roundtripped(const fs::path& src, const fs::path& dst, F roundtrip) {
  fs::create_directories(dst);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    if (fs::exists(src / f)) fs::copy_file(src / f, dst / f);
  auto ckpt = ax::safetensors::Checkpoint::open_dir(src.string());
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (const auto& n : ckpt.names()) {
    // per-expert hub keys (mlp.experts.3.gate_proj.weight) are projections too
    const bool expert = n.find(".experts.") != std::string::npos && n.find("_proj.weight") != std::string::npos;
    ts.emplace_back(n, (ax::models::is_projection(n) && n != "lm_head.weight") || expert ? roundtrip(ckpt.get(n)) : ckpt.get(n));
  }
  ax::safetensors::save((dst / "model.safetensors").string(), ts);
}

double loss_of(ax::Model& m, const ax::Batch& b) { return m.forward(b, false).loss.item<double>(); }

}  // namespace

TEST_CASE("qlora: an nf4 base is at most 0.6 bytes per packed parameter and only LoRA trains") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_bytes");
  ax::init_model_dir("tiny-llama", (dir / "model").string(), 5);  // hidden 64: every projection fits blocks of 64
  auto dense = env.load(dir / "model", policy("dense"), all_linear_lora());
  auto nf4 = env.load(dir / "model", policy("nf4"), all_linear_lora());
  auto dq = env.load(dir / "model", policy("nf4", 64, true), all_linear_lora());
  const auto sd = dense->weight_stats(), s4 = nf4->weight_stats(), s4d = dq->weight_stats();
  const int64_t projections = 2 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 128 * 64);  // 2 layers: q o, k v, gate up down
  CHECK(sd.packed_params == 0);
  CHECK(sd.bytes == 4 * sd.params);  // fp32, nothing packed
  CHECK(s4.format == "nf4");
  CHECK(s4.params == sd.params);
  CHECK(s4.packed_params == projections);
  CHECK(s4.kept.empty());
  const double bpp = double(s4.packed_bytes) / double(s4.packed_params);
  const double bpp_dq = double(s4d.packed_bytes) / double(s4d.packed_params);
  MESSAGE("nf4 packed base: " << bpp << " bytes/param (double quant " << bpp_dq << "); resident " << s4.bytes << " of dense "
                              << sd.bytes << " bytes; peak while loading " << s4.peak_bytes);
  CHECK(bpp <= 0.6);
  CHECK(bpp == doctest::Approx(0.5 + 4.0 / 64));  // 4-bit codes + an fp32 absmax per 64
  CHECK(bpp_dq < bpp);
  CHECK(s4.bytes == sd.bytes - (4 * projections - s4.packed_bytes));  // only the projections shrank
  CHECK(s4.peak_bytes < sd.bytes);  // no dense copy of the base was ever resident
  CHECK(s4.peak_bytes >= s4.bytes);

  // The packed fields are the model's parameters; none of them, nor any other base tensor, takes a gradient.
  bool saw_codes = false;
  for (const auto& [n, t] : nf4->named_parameters()) {
    if (n.find(".lora_") != std::string::npos) continue;
    CHECK_FALSE(t.requires_grad());
    if (n == "model.layers.0.self_attn.q_proj.weight") saw_codes = t.scalar_type() == at::kByte && t.numel() == 64 * 64 / 2;
  }
  CHECK(saw_codes);
  const ax::Batch b = batch(64);
  auto out = nf4->forward(b, false);
  out.loss.backward();
  for (const auto& [n, t] : nf4->named_parameters())
    if (n.find(".lora_") == std::string::npos) CHECK_FALSE(t.grad().defined());
  for (const auto& [n, t] : nf4->trainable_parameters())
    if (n.find("lora_B") != std::string::npos) CHECK(t.grad().abs().sum().item<double>() > 0);  // B starts at 0: A's grad is 0
  ax::test::remove_tree(dir);
}

TEST_CASE("qlora: the loss moves from dense by the quantisation error and equals the dequantised twin's") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_loss");
  ax::init_model_dir("tiny-llama", (dir / "model").string(), 5);
  const ax::Batch b = batch(64);
  const double dense = loss_of(*env.load(dir / "model", policy("dense")), b);
  struct Fmt {
    const char* name;
    std::function<at::Tensor(const at::Tensor&)> roundtrip;
  };
  const std::vector<Fmt> formats = {
      {"nf4", [](const at::Tensor& w) { return ax::ops::dequantize(ax::ops::quantize_nf4(w, 64), at::kFloat); }},
      {"mxfp4", [](const at::Tensor& w) { return ax::ops::dequantize(ax::ops::quantize_mxfp4(w, -1), at::kFloat); }},
      {"nvfp4", [](const at::Tensor& w) { return ax::ops::dequantize(ax::ops::quantize_nvfp4(w, -1), at::kFloat); }},
  };
  for (const auto& f : formats) {
    CAPTURE(f.name);
    auto packed = env.load(dir / "model", policy(f.name));
    CHECK(packed->weight_stats().packed_params > 0);
    const double lq = loss_of(*packed, b);
    write_roundtripped(dir / "model", dir / (std::string("twin_") + f.name), f.roundtrip);
    const double twin = loss_of(*env.load(dir / (std::string("twin_") + f.name), policy("dense")), b);
    MESSAGE(std::string(f.name) << ": loss " << lq << " vs dense " << dense << " (twin " << twin << ")");
    CHECK(lq != dense);                                       // the packed base is what ran...
    CHECK(std::abs(lq - dense) < 0.02 * dense);               // ...off by the quantisation error only
    CHECK(lq == doctest::Approx(twin).epsilon(1e-6));         // exactly the dequantised base's loss
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("qlora: MoE experts are packed too and train through moe.experts reference") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_moe");
  ax::init_model_dir("tiny-qwen3-moe", (dir / "model").string(), 5);
  ax::LoraSpec lora = all_linear_lora();
  const ax::Batch b = batch(64);
  const double dense = loss_of(*env.load(dir / "model", policy("dense")), b);
  for (const char* fmt : {"nf4", "mxfp4", "nvfp4"}) {
    CAPTURE(fmt);
    auto m = env.load(dir / "model", policy(fmt), lora);
    const auto st = m->weight_stats();
    const int64_t experts = 2 * (6 * 64 * 64 + 6 * 64 * 32), attention = 2 * (64 * 64 * 2 + 32 * 64 * 2);
    CHECK(st.packed_params == experts + attention);
    auto out = m->forward(b, false);
    CHECK(out.loss.item<double>() != dense);
    CHECK(std::abs(out.loss.item<double>() - dense) < 0.05 * dense);
    out.loss.backward();
    int with_grad = 0;
    for (const auto& [n, t] : m->trainable_parameters())
      with_grad += n.find("experts") != std::string::npos && n.find("lora_B") != std::string::npos &&
                   t.grad().defined() && t.grad().abs().sum().item<double>() > 0;
    CHECK(with_grad == 4);  // both layers' gate_up_proj and down_proj adapters, through the packed experts
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("qlora: the hybrid families pack every projection (linear attention, experts, shared expert), train, and equal the dequantised twin") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_hybrid");
  const ax::Batch b = batch(64);
  auto nf4 = [](const at::Tensor& w) { return ax::ops::dequantize(ax::ops::quantize_nf4(w, 64), at::kFloat); };
  for (const char* preset : {"tiny-qwen3_5", "tiny-qwen3_5-moe", "tiny-qwen3-next"}) {
    CAPTURE(preset);
    const fs::path model = dir / preset, twin = dir / (std::string(preset) + "-twin");
    ax::init_model_dir(preset, model.string(), 5);
    write_roundtripped(model, twin, nf4);
    // What the policy packs: every projection of the checkpoint but lm_head (write_roundtripped's choice).
    int64_t projections = 0;
    auto ckpt = ax::safetensors::Checkpoint::open_dir(model.string());
    auto twin_ckpt = ax::safetensors::Checkpoint::open_dir(twin.string());
    for (const auto& n : ckpt.names())
      if (!at::equal(ckpt.get(n), twin_ckpt.get(n))) projections += ckpt.get(n).numel();
    ax::LoraSpec lora = all_linear_lora();
    lora.targets.push_back("out_proj");  // the linear-attention layers' output projection
    auto m = env.load(model, policy("nf4"), lora);
    const auto st = m->weight_stats();
    CHECK(st.kept.empty());
    CHECK(st.packed_params == projections);
    auto out = m->forward(b, false);
    out.loss.backward();
    int with_grad = 0, factors = 0;
    for (const auto& [n, t] : m->trainable_parameters())
      if (n.find("lora_B") != std::string::npos) {
        ++factors;
        with_grad += t.grad().defined() && t.grad().abs().sum().item<double>() > 0;
      }
    CHECK(factors > 0);
    CHECK(with_grad == factors);  // every adapter trains through its packed base, linear_attn.out_proj included
    const double lq = loss_of(*env.load(model, policy("nf4")), b);
    CHECK(lq != loss_of(*env.load(model, policy("dense")), b));
    CHECK(lq == doctest::Approx(loss_of(*env.load(twin, policy("dense")), b)).epsilon(1e-6));
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("qlora: skip_modules quant_blocksize and double_quant change what is packed and how") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_policy");
  ax::init_model_dir("tiny-llama", (dir / "model").string(), 5);
  auto p = policy("nf4");
  p.skip_modules = {"o_proj", "layers.1.mlp"};
  auto m = env.load(dir / "model", p);
  auto st = m->weight_stats();
  CHECK(st.kept.size() == 2 + 3);  // both layers' o_proj, layer 1's gate/up/down
  CHECK(st.packed_params == 2 * (64 * 64 + 32 * 64 * 2) + 3 * 128 * 64);
  for (const auto& [n, t] : m->named_parameters()) {
    if (n == "model.layers.0.self_attn.o_proj.weight" || n == "model.layers.1.mlp.up_proj.weight") CHECK((t.scalar_type() == at::kFloat));
    if (n == "model.layers.1.self_attn.o_proj.weight.scales") FAIL("o_proj was packed");
    if (n == "model.layers.0.mlp.up_proj.weight") CHECK((t.scalar_type() == at::kByte));
  }
  // A name that matches no module is refused, with the closest one.
  p.skip_modules = {"o_prj"};
  CHECK_THROWS_WITH_AS(env.load(dir / "model", p), doctest::Contains("model.skip_modules: 'o_prj' names no module of this model (did you mean 'o_proj'?)"),
                       ax::UsageError);
  // Blocksize: 128 halves the absmax count; double quant stores them as bytes plus a nested scale.
  auto absmax = [&](const ax::WeightPolicy& pol) {
    for (const auto& [n, t] : env.load(dir / "model", pol)->named_parameters())
      if (n == "model.layers.0.mlp.gate_proj.weight.scales") return t;
    return at::Tensor();
  };
  at::Tensor a64 = absmax(policy("nf4")), a128 = absmax(policy("nf4", 128)), adq = absmax(policy("nf4", 64, true));
  REQUIRE(a64.defined());
  CHECK(a64.numel() == 128 * 64 / 64);
  CHECK(a128.numel() == 128 * 64 / 128);
  CHECK((adq.scalar_type() == at::kByte));
  CHECK(adq.numel() == a64.numel());
  CHECK(env.load(dir / "model", policy("nf4", 64, true))->weight_stats().packed_bytes <
        env.load(dir / "model", policy("nf4"))->weight_stats().packed_bytes);
  // A projection whose size does not fit the blocks stays dense and is listed as such (hidden 20: no
  // projection holds a multiple of 64 elements).
  auto odd = env.load(fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "llama", policy("nf4"));
  CHECK(odd->weight_stats().packed_params == 0);
  REQUIRE(!odd->weight_stats().kept.empty());
  CHECK(odd->weight_stats().kept[0].find("not a multiple of blocksize 64") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("qlora: with kernels.strict a backend that lacks the weight format fails the load naming op and format") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_strict");
  ax::init_model_dir("tiny-llama", (dir / "model").string(), 5);
  ax::Provider p;  // a linear.lora backend that takes dense weights only
  p.info.kind = ax::ProviderKind::kernel;
  p.info.op = "linear.lora";
  p.info.name = "dense_only";
  p.info.needs.formats = {"dense"};
  p.object = env.reg.kernel<ax::ops::LinearLora>("reference");
  env.reg.add(p);
  ax::KernelPreferences prefs;
  prefs.strict = true;
  prefs.prefer["linear.lora"] = {"dense_only"};
  CHECK_NOTHROW(env.load(dir / "model", policy("dense"), {}, prefs));
  CHECK_THROWS_WITH_AS(env.load(dir / "model", policy("nf4"), {}, prefs),
                       doctest::Contains("no backend for linear.lora (dtype fp32, format nf4)"), ax::UsageError);
  prefs.strict = false;  // not strict: reference is the fallback, and says so
  auto set = std::make_shared<ax::KernelSet>(env.reg, prefs, ax::DeviceInfo{});
  CHECK(set->get_backend("linear.lora", "fp32", "mxfp4", "") == env.reg.kernel<ax::ops::LinearLora>("reference"));
  ax::test::remove_tree(dir);
}

TEST_CASE("qlora: a quantizer is a provider and a plugin one is preferred over reference") {
  Env env;
  const ax::Provider* ref = env.reg.find(ax::ProviderKind::quantizer, "", "reference");
  REQUIRE(ref);
  CHECK(ref->info.key() == "quantizer reference");
  ax::DeviceInfo cuda;
  cuda.type = ax::DeviceInfo::Type::cuda;
  cuda.arch = 90;
  ax::Provider p;  // as a plugin's fast CUDA nf4 quantizer would be declared
  p.info.kind = ax::ProviderKind::quantizer;
  p.info.name = "fast_nf4";
  p.info.needs.devices = {"cuda"};
  p.info.needs.formats = {"nf4"};
  p.info.plugin = "nf4";
  p.object = ref->object;
  env.reg.add(p);
  CHECK(ax::resolve_quantizer(env.reg, {cuda, "", "nf4", ""}).chosen == "fast_nf4");
  auto cpu = ax::resolve_quantizer(env.reg, {ax::DeviceInfo{}, "", "nf4", ""});
  CHECK(cpu.chosen == "reference");
  CHECK(cpu.candidates[0].verdict == "needs cuda, device is cpu");
  CHECK(ax::resolve_quantizer(env.reg, {cuda, "", "mxfp4", ""}).chosen == "reference");
  ax::Registry empty;
  ax::KernelSet none(empty, {}, ax::DeviceInfo{});
  CHECK_THROWS_WITH_AS(none.quantizer("nf4"), doctest::Contains("no quantizer for it"), ax::UsageError);
}

TEST_CASE("cli: a QLoRA run trains a tiny llama on an nf4 base; merge-lora rebuilds that base from the adapter's training record") {
  auto dir = ax::test::setup_run("cli_qlora", "max_steps = 12\n");
  const std::string cfg = (dir / "run.toml").string();
  {  // the weight keys go into the file: merge-lora --config reads them from there
    std::string text = ax::test::slurp(cfg);
    const std::string path_line = "path = \"model\"\n";
    REQUIRE(text.find(path_line) != std::string::npos);
    text.replace(text.find(path_line), path_line.size(), path_line + "weight_format = \"nf4\"\ndouble_quant = true\n");
    std::ofstream(cfg) << text;
  }
  int rc = ax::test::run({"run", "--config", cfg}, dir / "run.log");
  std::string log = ax::test::slurp(dir / "run.log");
  INFO(log);
  REQUIRE(rc == 0);
  // what really runs, per format (the compute dtype is the machine's: fp32 on a CPU, where the reference
  // runs; bf16 on a GPU, where the nf4 plugin's QLoRA linear and quantizer run when it is built, else core's
  // production `aten` and the reference quantizer)
  CHECK(std::regex_search(log, std::regex(R"(linear\.lora +(reference +fp32|aten +bf16|nf4 +bf16),nf4)")));
  CHECK(std::regex_search(log, std::regex(R"(quantize +(reference|nf4) +nf4)")));
  auto at = log.find("base weights    nf4: ");
  REQUIRE(at != std::string::npos);
  CHECK(log.find("peak ", at) != std::string::npos);
  CHECK(log.find("bytes/param", at) != std::string::npos);
  MESSAGE(log.substr(at, log.find('\n', at) - at));
  auto steps = ax::test::step_records(dir / "out" / "metrics.jsonl");
  REQUIRE(steps.size() == 12);
  CHECK(steps.back()["loss"].get<double>() < steps.front()["loss"].get<double>());

  // The adapter carries its training record beside the peft files.
  auto adapter = dir / "out" / "checkpoints" / "step-00000012";
  const auto record = nlohmann::json::parse(ax::test::slurp(adapter / "axengine_training.json"));
  CHECK(record["weights"]["weight_format"] == "nf4");
  CHECK(record["weights"]["double_quant"] == true);
  CHECK(record["weights"]["quant_blocksize"] == 64);
  CHECK(record["base_format"] == "nf4");
  CHECK(record["base_model"] == fs::absolute(dir / "model").lexically_normal().string());
  CHECK((record["dtype"] == "fp32" || record["dtype"] == "bf16"));  // the run's compute dtype: CPU or GPU
  CHECK(nlohmann::json::parse(ax::test::slurp(adapter / "adapter_config.json"))["peft_type"] == "LORA");

  // The model training ran: the adapter on the packed base.
  Env env;
  ax::ModelLoadOptions o;
  o.dir = (dir / "model").string();
  o.kernels = std::make_shared<ax::KernelSet>(env.reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  o.adapter_dir = adapter.string();
  o.weights = policy("nf4", 64, true);
  const ax::Batch b = batch(200);
  const at::Tensor trained = ax::load_model(env.reg, o)->forward(b, true).logits.detach();
  auto merged_logits = [&](const fs::path& merged) { return env.load(merged, {})->forward(b, true).logits.detach(); };
  // fp32 on the CPU: the merged dense weight is dequant(W) + scaling * B A, one rounding away from the packed
  // model's dequant(W) x + scaling * B (A x) (docs/weights.md, "Adapters and merging").
  constexpr double kMergeTolerance = 1e-4;

  // 1. No --config: the record says how the base was packed (and which base it is: no --model either).
  rc = ax::test::run({"merge-lora", "--adapter", adapter.string(), "--out", (dir / "merged").string()}, dir / "merge.log");
  std::string merge_log = ax::test::slurp(dir / "merge.log");
  INFO(merge_log);
  REQUIRE(rc == 0);
  CHECK(merge_log.find("(nf4 base, dequantised)") != std::string::npos);
  auto merged = ax::safetensors::File::open((dir / "merged" / "model.safetensors").string());
  for (const auto& t : merged->tensors()) CHECK((t.scalar_type == at::kFloat));
  const double err_record = (merged_logits(dir / "merged") - trained).abs().max().item<double>();
  CHECK(err_record <= kMergeTolerance);
  const auto what = nlohmann::json::parse(ax::test::slurp(dir / "merged" / "axengine_merge.json"));
  CHECK(what["weights"]["weight_format"] == "nf4");
  CHECK(what["base_format"] == "nf4");
  CHECK(what["dtype"] == "float32");
  CHECK(what["adapter"] == fs::absolute(adapter).lexically_normal().string());
  CHECK(what["base_model"] == record["base_model"]);
  CHECK(what["training"] == record);
  CHECK(what["axengine_version"].is_string());

  // 2. With the run's config: the same base, the same model.
  rc = ax::test::run({"merge-lora", "--config", cfg, "--adapter", adapter.string(), "--out", (dir / "merged_cfg").string()},
                     dir / "merge_cfg.log");
  REQUIRE(rc == 0);
  CHECK((merged_logits(dir / "merged_cfg") - trained).abs().max().item<double>() <= kMergeTolerance);

  // 3. A config that packs the base otherwise is refused, naming both; nothing is written.
  std::ofstream(dir / "dense.toml") << "[model]\npath = \"model\"\n";
  rc = ax::test::run({"merge-lora", "--config", (dir / "dense.toml").string(), "--adapter", adapter.string(), "--out",
                      (dir / "merged_dense").string()},
                     dir / "merge_dense.log");
  CHECK(rc == 2);
  CHECK(ax::test::slurp(dir / "merge_dense.log").find("says the adapter was trained with weight_format nf4 (quant_blocksize 64, "
                                                      "double_quant true), but --config gives dense") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "merged_dense"));

  // 4. Without the record (an adapter from elsewhere) the base is taken as stored, with a warning: the dense
  // merge the issue found, another model.
  fs::remove(adapter / "axengine_training.json");
  rc = ax::test::run({"merge-lora", "--model", (dir / "model").string(), "--adapter", adapter.string(), "--out",
                      (dir / "merged_norecord").string()},
                     dir / "merge_norecord.log");
  REQUIRE(rc == 0);
  CHECK(ax::test::slurp(dir / "merge_norecord.log").find("has no axengine_training.json") != std::string::npos);
  const double err_dense = (merged_logits(dir / "merged_norecord") - trained).abs().max().item<double>();
  MESSAGE("merged vs training-time logits, max |diff|: from the record ", err_record, ", onto the dense base ", err_dense);
  CHECK(err_dense > 10 * kMergeTolerance);
  ax::test::remove_tree(dir);
}

TEST_CASE("merge-lora: the training record rebuilds an nf4, mxfp4 or nvfp4 base; an explicit policy that disagrees is refused") {
  Env env;
  auto dir = ax::test::scratch_dir("qlora_record_merge");
  ax::test::make_tiny_llama(dir / "model");
  const ax::Batch b = batch(200);
  for (const auto& weights : {policy("nf4", 32), policy("mxfp4"), policy("nvfp4")}) {
    CAPTURE(weights.format);
    auto model = env.load(dir / "model", weights, all_linear_lora());
    {
      at::NoGradGuard ng;
      auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
      for (auto& [n, t] : model->trainable_parameters())
        if (n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_B") == 0) t.normal_(0, 0.5, gen);
    }
    const at::Tensor trained = model->forward(b, true).logits.detach();
    const fs::path adapter = dir / ("adapter_" + weights.format);
    model->save_adapter(adapter.string());
    ax::models::TrainingRecord rec;  // what `run` writes beside every adapter
    rec.base_model = (dir / "model").string();
    rec.weights = weights;
    rec.base_format = model->weight_stats().format;
    rec.dtype = "fp32";
    ax::models::write_training_record(adapter.string(), rec);

    const fs::path out = dir / ("merged_" + weights.format);
    ax::merge_lora_dir(env.reg, "", adapter.string(), out.string(), "fp32");  // base and policy from the record
    CHECK((env.load(out, {})->forward(b, true).logits - trained).abs().max().item<double>() <= 1e-4);
    const std::string refused = "says the adapter was trained with weight_format " + weights.format;
    CHECK_THROWS_WITH_AS(ax::merge_lora_dir(env.reg, (dir / "model").string(), adapter.string(), (dir / "x").string(), "fp32",
                                            ax::WeightPolicy{}),
                         doctest::Contains(refused.c_str()), ax::UsageError);
    ax::WeightPolicy other = weights;
    other.skip_modules = {"o_proj"};
    CHECK_THROWS_WITH_AS(ax::merge_lora_dir(env.reg, "", adapter.string(), (dir / "x").string(), "fp32", other),
                         doctest::Contains("but --config gives"), ax::UsageError);
    CHECK_FALSE(fs::exists(dir / "x"));
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("cli: kernels.strict with no fitting linear.lora backend exits 2 at start naming op dtype and format") {
  // The only listed backend (a test plugin's) needs a CPU while device.arch plans for a GPU: nothing fits, on
  // any machine, and a QLoRA run stops before loading or quantising anything.
  auto dir = ax::test::setup_run("cli_qlora_strict", "max_steps = 2\n");
  int rc = ax::test::run({"run", "--config", (dir / "run.toml").string(), "--set", "model.weight_format=mxfp4", "--set",
                          "kernels.strict=true", "--set", "device.arch=sm_90", "--set", "kernels.linear_lora=[\"conf_correct\"]",
                          "--set", "plugins.paths=[\"" + std::string(AXENGINE_TEST_PLUGIN_DIR) + "/conformance/axengine_conf_correct.so\"]"},
                         dir / "run.log");
  std::string log = ax::test::slurp(dir / "run.log");
  INFO(log);
  CHECK(rc == 2);
  CHECK(log.find("kernels.strict: no backend for linear.lora (dtype bf16, format dense) on sm_90 from [kernels]") != std::string::npos);
  CHECK(log.find("conf_correct: needs cpu") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "out" / "metrics.jsonl"));
  ax::test::remove_tree(dir);
}

TEST_CASE("config: the nf4-only weight keys and skip_modules are refused where they would do nothing") {
  auto dir = ax::test::scratch_dir("qlora_config");
  auto error_of = [&](const std::string& model_table) -> std::string {
    std::ofstream(dir / "run.toml") << "[model]\npath = \"m\"\n" << model_table;
    try {
      ax::load_config((dir / "run.toml").string());
    } catch (const ax::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of("weight_format = \"nf4\"\nquant_blocksize = 128\ndouble_quant = true\nskip_modules = [\"o_proj\"]\n").empty());
  const std::string mx = error_of("weight_format = \"mxfp4\"\nquant_blocksize = 128\n");
  CHECK(mx.find("run.toml:4:") != std::string::npos);  // the line of the key
  CHECK(mx.find("'model.quant_blocksize' applies to weight_format = \"nf4\" only (this config has \"mxfp4\")") !=
        std::string::npos);
  CHECK(error_of("double_quant = true\n").find("'model.double_quant' applies to weight_format = \"nf4\" only") != std::string::npos);
  CHECK(error_of("skip_modules = [\"o_proj\"]\n").find("'model.skip_modules' needs a weight_format other than \"dense\"") !=
        std::string::npos);
  CHECK(error_of("weight_format = \"nf4\"\nquant_blocksize = 48\n").find("not a power of two") != std::string::npos);
  CHECK(!error_of("weight_format = \"nf4\"\nquant_blocksize = 8\n").empty());
  auto cfg = ax::load_config((dir / "run.toml").string(), {"model.quant_blocksize=16"});
  const ax::WeightPolicy p = ax::weight_policy(cfg.model);
  CHECK(p.format == "nf4");
  CHECK(p.blocksize == 16);
  ax::test::remove_tree(dir);
}
