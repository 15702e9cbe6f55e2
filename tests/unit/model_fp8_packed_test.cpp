// [model] weight_format = "fp8": a fine-grained FP8 checkpoint's projections kept as stored (ops::WeightFormat::fp8,
// decoded by the ops on use) against the same checkpoint dequantised at load (the default). The decode is the
// load's arithmetic, so the two models compute the same bits: logits, loss, LoRA gradients and training steps are
// compared exactly. Cases: tests/data/models/deepseek_v3_fp8 and glm4_moe_fp8 (scripts/goldens/make_fp8_goldens.py).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/builtins.hpp"
#include "axengine/device.hpp"
#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "axengine/models.hpp"
#include "axengine/ops/fp8.hpp"
#include "axengine/ops/linear_lora.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/safetensors.hpp"
#include "axengine/selection.hpp"
#include "models/fp8_load.hpp"
#include "models/layer_bytes.hpp"
#include "models/unfrozen.hpp"
#include "unit/cli_util.hpp"
#include "unit/fp8_case_util.hpp"
#include "unit/model_case_util.hpp"
#include "unit/model_hybrid_checks.hpp"
#include "unit/run_compare.hpp"
#include "unit/test_paths.hpp"

namespace fs = std::filesystem;

namespace {

struct Env {
  ax::Registry reg;
  Env() { ax::register_builtins(reg); }
  std::unique_ptr<ax::Model> load(const fs::path& dir, const std::string& format, const std::string& dtype = "fp32",
                                  std::optional<ax::LoraSpec> lora = {}, std::vector<std::string> skip = {},
                                  const std::string& device = "cpu") {
    ax::ModelLoadOptions o;
    o.dir = dir.string();
    o.dtype = dtype;
    o.device = device == "cpu" ? "cpu" : "cuda:0";
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{},
                                                device == "cpu" ? ax::DeviceInfo{} : ax::detect_device("cuda"));
    o.lora = std::move(lora);
    o.weights.format = format;
    o.weights.skip_modules = std::move(skip);
    return ax::load_model(reg, o);
  }
};

ax::LoraSpec lora_for(const std::string& c) {
  ax::LoraSpec s;
  s.targets = c == "deepseek_v3_fp8" ? std::vector<std::string>{"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"}
                                     : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  s.r = 4;
  s.alpha = 8;
  s.seed = 3;
  return s;
}

// lora_B drawn (it starts at 0) so the adapters change the outputs; the same draw for every model.
void draw_lora_b(ax::Model& m) {
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (auto& [n, t] : m.trainable_parameters())
    // Drawn on the host and copied: a CPU generator cannot fill a CUDA tensor, and the draw stays the same
    // on every device.
    if (n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_B") == 0)
      t.copy_(at::empty(t.sizes(), t.options().device(at::kCPU)).normal_(0, 0.3, gen));
}

ax::Batch batch(int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  ax::Batch b;
  b.input_ids = at::randint(vocab, {2, 12}, gen, at::kLong);
  b.labels = b.input_ids.clone();
  return b;
}

// `steps` SGD steps on the LoRA factors; the loss before each.
std::vector<at::Tensor> train(ax::Model& m, const ax::Batch& b, int steps) {
  std::vector<at::Tensor> losses;
  for (int s = 0; s < steps; ++s) {
    at::Tensor loss = m.forward(b, false).loss;
    loss.backward();
    losses.push_back(loss.detach().clone());
    at::NoGradGuard ng;
    for (auto& [n, t] : m.trainable_parameters()) {
      t.sub_(t.grad().to(t.scalar_type()) * 0.05);
      t.mutable_grad().zero_();
    }
  }
  return losses;
}

// Elements and bytes (weights + fp32 scales) of every FP8 tensor of a checkpoint.
std::pair<int64_t, int64_t> fp8_size(const fs::path& dir) {
  auto ckpt = ax::safetensors::Checkpoint::open_dir(dir.string());
  int64_t params = 0, bytes = 0;
  for (const auto& n : ckpt.names()) {
    if (ckpt.info(n).scalar_type != at::kFloat8_e4m3fn) continue;
    const int64_t w = ckpt.get(n).numel(), s = ckpt.get(ax::models::fp8_scale_key(n)).numel();
    params += w;
    bytes += w + 4 * s;
  }
  return {params, bytes};
}

}  // namespace

TEST_CASE("fp8 packed: DeepSeek-V3 and GLM-4.5 FP8 checkpoints kept packed at ~1 byte/param train exactly as dequantised") {
  Env env;
  for (const std::string c : {"deepseek_v3_fp8", "glm4_moe_fp8"}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      CAPTURE(c);
      CAPTURE(dtype);
      const fs::path dir = ax::test::case_dir(c);
      auto dense = env.load(dir, "dense", dtype, lora_for(c));
      auto packed = env.load(dir, "fp8", dtype, lora_for(c));
      draw_lora_b(*dense);
      draw_lora_b(*packed);
      // Every FP8 tensor is held as stored: 1 byte a weight plus an fp32 scale per 8 x 16 block.
      const auto [params, bytes] = fp8_size(dir);
      const auto st = packed->weight_stats(), sd = dense->weight_stats();
      CHECK(st.format == "fp8");
      // The script stores kv_a_proj_with_mqa unquantised (its name does not end in "proj.weight"): held as stored.
      std::vector<std::string> kept;
      if (c == "deepseek_v3_fp8")
        for (const char* l : {"0", "1"})
          kept.push_back(ax::str("model.layers.", l, ".self_attn.kv_a_proj_with_mqa (not stored in FP8 in the checkpoint)"));
      CHECK(st.kept == kept);
      CHECK(st.packed_params == params);
      CHECK(st.packed_bytes == bytes);
      CHECK(double(st.packed_bytes) / double(st.packed_params) == doctest::Approx(1.0 + 4.0 / 128));
      CHECK(sd.packed_params == 0);
      CHECK(st.bytes == sd.bytes - (params * (dtype == "fp32" ? 4 : 2) - bytes));  // only the projections changed
      bool saw_fp8 = false;
      for (const auto& [n, t] : packed->named_parameters()) {
        if (n.find(".lora_") != std::string::npos) continue;
        CHECK_FALSE(t.requires_grad());
        saw_fp8 = saw_fp8 || t.scalar_type() == at::kFloat8_e4m3fn;
      }
      CHECK(saw_fp8);
      // Same logits, same LoRA gradients, same steps: bit for bit.
      const ax::Batch b = batch(ax::test::config_of(c)["vocab_size"].get<int64_t>());
      CHECK(at::equal(packed->forward(b, true).logits, dense->forward(b, true).logits));
      const auto lp = train(*packed, b, 3), ld = train(*dense, b, 3);
      for (std::size_t s = 0; s < lp.size(); ++s) CHECK(at::equal(lp[s], ld[s]));
      CHECK(lp.back().item<double>() < lp.front().item<double>());
      auto tp = packed->trainable_parameters(), td = dense->trainable_parameters();
      REQUIRE(tp.size() == td.size());
      for (std::size_t i = 0; i < tp.size(); ++i) CHECK(at::equal(tp[i].second, td[i].second));
    }
  }
}

TEST_CASE("fp8 packed: on CUDA (bf16: aten linear.lora, the experts' reference) packed equals dequantised bit for bit") {
  if (!at::hasCUDA()) {
    MESSAGE("skipped: needs a CUDA device (no CUDA device present)");
    return;
  }
  Env env;
  for (const std::string c : {"deepseek_v3_fp8", "glm4_moe_fp8"}) {
    CAPTURE(c);
    auto dense = env.load(ax::test::case_dir(c), "dense", "bf16", lora_for(c), {}, "cuda");
    auto packed = env.load(ax::test::case_dir(c), "fp8", "bf16", lora_for(c), {}, "cuda");
    draw_lora_b(*dense);
    draw_lora_b(*packed);
    ax::Batch b = batch(ax::test::config_of(c)["vocab_size"].get<int64_t>());
    b = b.to(at::Device(at::kCUDA, 0));
    CHECK(at::equal(packed->forward(b, true).logits.cpu(), dense->forward(b, true).logits.cpu()));
    const auto lp = train(*packed, b, 2), ld = train(*dense, b, 2);
    for (std::size_t s = 0; s < lp.size(); ++s) CHECK(at::equal(lp[s].cpu(), ld[s].cpu()));
  }
}

TEST_CASE("fp8 packed: the GLM-4.5 FP8 case gives transformers' logits packed and dequantised") {
  Env env;
  const fs::path dir = ax::test::case_dir("glm4_moe_fp8");
  auto golden = ax::safetensors::File::open((dir / "golden.safetensors").string());
  ax::Batch b;
  b.input_ids = golden->get("input_ids");
  for (const char* format : {"dense", "fp8"}) {
    CAPTURE(format);
    CHECK(ax::test::rel_max(env.load(dir, format)->forward(b, true).logits, golden->get("logits")) <= 1e-5);
  }
}

TEST_CASE("fp8 packed: ragged edge blocks decode as at load; per-expert pieces off the block grid and skip_modules stay dequantised") {
  // Blocks of 32 x 16 over the DeepSeek-V3 case (every scale grid cut to rows 0, 4, 8, ... of the 8 x 16 one):
  // kv_a_proj_with_mqa's 24 rows and the experts' 16 make ragged edge blocks, and an expert's gate and up (16 rows
  // each) would share a block once fused, so gate_up_proj is dequantised at load and says why.
  Env env;
  auto regrid = [](ax::test::Fp8Tensors& t) {
    for (auto& [n, v] : t)
      if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0) v = v.slice(0, 0, v.size(0), 4).contiguous();
  };
  ax::test::EditedFp8 e(regrid, [](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = {32, 16}; });
  auto dense = env.load(e.dir, "dense", "fp32", lora_for("deepseek_v3_fp8"));
  auto packed = env.load(e.dir, "fp8", "fp32", lora_for("deepseek_v3_fp8"), {"layers.0.self_attn.o_proj"});
  draw_lora_b(*dense);
  draw_lora_b(*packed);
  const auto st = packed->weight_stats();
  REQUIRE(st.kept.size() == 4);  // and the two unquantised kv_a_proj_with_mqa
  CHECK(st.kept[1] == "model.layers.0.self_attn.o_proj (skip_modules 'layers.0.self_attn.o_proj', dequantised)");
  CHECK(st.kept[3].find("model.layers.1.mlp.experts.gate_up_proj (its per-expert pieces have 16 rows, not a multiple of "
                        "weight_block_size's 32") == 0);
  CHECK(st.packed_params > 0);
  const ax::Batch b = batch(64);
  CHECK(at::equal(packed->forward(b, true).logits, dense->forward(b, true).logits));
  const auto lp = train(*packed, b, 2), ld = train(*dense, b, 2);
  for (std::size_t s = 0; s < lp.size(); ++s) CHECK(at::equal(lp[s], ld[s]));
}

TEST_CASE("fp8 packed: the decode equals transformers' on ragged blocks, selects experts, and refuses malformed fp8 weights") {
  // The ragged golden (transformers' _dequantize_fp8_weight) through the WeightTensor the ops decode.
  auto f = ax::safetensors::File::open((ax::test::case_dir("deepseek_v3_fp8") / "ragged.safetensors").string());
  const ax::ops::WeightTensor w = ax::models::fp8_weight(f->get("weight"), f->get("weight_scale_inv"), 8, 16);
  CHECK(at::equal(ax::ops::dequantize(w, at::kFloat), f->get("dequantized")));
  CHECK(at::equal(ax::ops::dequantize(w, at::kBFloat16), f->get("dequantized").to(at::kBFloat16)));
  // Experts: a stacked weight, selected (out of order, repeated) equals the whole one indexed.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const ax::ops::WeightTensor e = ax::ops::quantize_fp8_blocks(at::randn({4, 20, 40}, gen), 8, 16);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{3, 0, 3});
  CHECK(at::equal(ax::ops::dequantize(e, at::kFloat, ids), ax::ops::dequantize(e, at::kFloat).index_select(0, ids)));
  // Bad fields: the op names the field; a scale grid of another block size is the wrong shape.
  ax::ops::LinearLoraArgs a;
  a.x = at::randn({3, 40});
  a.weight = w;
  a.weight.block_rows = 16;  // the scales are a grid of 8-row blocks: [3, 3], not [2, 3]
  auto reference = [] {
    ax::Registry reg;
    ax::register_builtins(reg);
    return ax::KernelSet(reg, ax::KernelPreferences{}, ax::DeviceInfo{}).get<ax::ops::LinearLora>("fp32", "fp8");
  }();
  CHECK_THROWS_WITH_AS(reference->forward(a), doctest::Contains("linear.lora: weight.scales: must have shape [2, 3], got [3, 3]"),
                       ax::UsageError);
  a.weight = w;
  a.weight.codes = a.weight.codes.to(at::kFloat8_e5m2);
  CHECK_THROWS_WITH_AS(reference->forward(a), doctest::Contains("weight.codes: must be"), ax::UsageError);
}

TEST_CASE("fp8 packed: weight_format fp8 is refused where it cannot keep anything; packed weights cannot be unfrozen") {
  Env env;
  auto dir = ax::test::scratch_dir("fp8_refused");
  ax::init_model_dir("tiny-deepseek-v3", (dir / "dense").string(), 5);
  CHECK_THROWS_WITH_AS(env.load(dir / "dense", "fp8"),
                       doctest::Contains("model.weight_format = \"fp8\" keeps a fine-grained FP8 checkpoint's weights as "
                                         "stored, but"),
                       ax::UsageError);
  ax::ModelLoadOptions o;
  o.dir = ax::test::case_dir("deepseek_v3_fp8").string();
  o.kernels = std::make_shared<ax::KernelSet>(env.reg, ax::KernelPreferences{}, ax::DeviceInfo{});
  o.weights.format = "fp8";
  CHECK_THROWS_WITH_AS(ax::models::plan_unfrozen(o, {"model.layers.1.self_attn.kv_b_proj"}),
                       doctest::Contains("matches 'model.layers.1.self_attn.kv_b_proj.weight', which the base holds packed (fp8)"),
                       ax::UsageError);
  // A misshapen scale under weight_format fp8: the load names the tensor, as without it.
  ax::test::EditedFp8 e([](ax::test::Fp8Tensors& t) {
    for (auto& [n, v] : t)
      if (n == "model.layers.1.self_attn.kv_b_proj.weight_scale_inv") v = at::ones({2, 2});
  }, [](nlohmann::json&) {});
  CHECK_THROWS_WITH_AS(env.load(e.dir, "fp8"),
                       doctest::Contains("tensor 'model.layers.1.self_attn.kv_b_proj.weight_scale_inv' has shape [2, 2] but"),
                       ax::UsageError);
  ax::test::remove_tree(dir);
}

TEST_CASE("fp8 packed: inspect reports the bytes per parameter an FP8 release keeps") {
  const std::string info = ax::inspect_model_dir(ax::test::case_dir("deepseek_v3_fp8").string());
  const auto [params, bytes] = fp8_size(ax::test::case_dir("deepseek_v3_fp8"));
  char bpp[32];
  std::snprintf(bpp, sizeof bpp, "%.4f", double(bytes) / double(params));
  CHECK(info.find(ax::str("(model.weight_format = \"fp8\" keeps them: ", params, " parameters at ", bpp,
                          " bytes/param incl. scales)")) != std::string::npos);
  // A DeepSeek-V3-shaped sparse layer as the release stores it: every projection in fp8 + a scale per 128 x 128.
  nlohmann::json j = ax::test::config_of("deepseek_v3");
  j.update({{"hidden_size", 7168}, {"num_attention_heads", 128}, {"num_key_value_heads", 128}, {"q_lora_rank", 1536},
            {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
            {"n_routed_experts", 256}, {"num_experts_per_tok", 8}, {"n_group", 8}, {"topk_group", 4},
            {"moe_intermediate_size", 2048}, {"intermediate_size", 18432}, {"n_shared_experts", 1},
            {"first_k_dense_replace", 3}, {"num_hidden_layers", 4}, {"vocab_size", 129280},
            {"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}});
  const auto b = ax::models::moe_layer_bytes(ax::models::parse_hf_config(j, "DeepSeek-V3/config.json"));
  const int64_t H = 7168, mla = 1536 * H + 128LL * 192 * 1536 + 576 * H + 128LL * 256 * 512 + H * 128LL * 128;
  CHECK(b.other_projection_params == mla);
  const double per = 1.0 + 4.0 / (128 * 128), rest = double(b.other_params - mla) * 2.0;
  CHECK(b.bytes("fp8") == doctest::Approx(double(b.expert_params + mla) * per + rest));
  CHECK(b.bytes_per_param("fp8") == doctest::Approx(1.0004).epsilon(1e-4));  // the router and norms stay bf16
}

TEST_CASE("cli: an FP8 base kept packed trains, resumes bitwise, equals the dequantised run, and merges as it") {
  // The tiny llama of setup_run, its projections stored fine-grained FP8 (8 x 16 blocks), as an "-FP8" release.
  auto dir = ax::test::setup_run("cli_fp8", std::string("max_steps = 4\n[checkpoint]\nevery_steps = 2\nkeep_last = 10\n") +
                                                ax::test::kOnCpu);
  {
    auto ckpt = ax::safetensors::Checkpoint::open_dir((dir / "model").string());
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& n : ckpt.names()) {
      at::Tensor t = ckpt.get(n);
      if (n.rfind("model.layers.", 0) == 0 && n.size() > 12 && n.compare(n.size() - 12, 12, "_proj.weight") == 0) {
        const ax::ops::WeightTensor q = ax::ops::quantize_fp8_blocks(t, 8, 16);
        out.emplace_back(n, q.codes);
        out.emplace_back(ax::models::fp8_scale_key(n), q.scales);
      } else {
        out.emplace_back(n, t);
      }
    }
    for (const auto& e : fs::directory_iterator(dir / "model"))
      if (e.path().extension() == ".safetensors") fs::remove(e.path());
    ax::safetensors::save((dir / "model" / "model.safetensors").string(), out);
    nlohmann::json cfg = nlohmann::json::parse(ax::test::slurp(dir / "model" / "config.json"));
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {8, 16}}};
    std::ofstream(dir / "model" / "config.json") << cfg.dump(2);
  }
  auto run = [&](const std::string& out, const std::vector<std::string>& extra, bool resume = false) {
    std::vector<std::string> a{"run", "--config", (dir / "run.toml").string(), "--set", "run.output_dir=" + out};
    a.insert(a.end(), extra.begin(), extra.end());
    if (resume) a.push_back("--resume");
    const int rc = ax::test::run(a, dir / (out + ".log"));
    INFO(ax::test::slurp(dir / (out + ".log")));
    return rc;
  };
  const std::vector<std::string> fp8{"--set", "model.weight_format=fp8"};
  REQUIRE(run("packed", fp8) == 0);
  const std::string log = ax::test::slurp(dir / "packed.log");
  CHECK(log.find("base weights    fp8: ") != std::string::npos);
  CHECK(log.find("linear.lora") != std::string::npos);
  REQUIRE(run("dequantised", {}) == 0);
  // The dequantised run is the same run: every step's loss, and the adapter, bit for bit.
  ax::test::check_same_run(dir / "packed", dir / "dequantised", 4);
  // Resume: 2 steps, then --resume to 4, ends as the run through.
  auto half = fp8;
  half.insert(half.end(), {"--set", "train.max_steps=2"});
  REQUIRE(run("resumed", half) == 0);
  REQUIRE(run("resumed", fp8, true) == 0);
  auto steps = [](const fs::path& out) {  // the training steps' records (the first part also evaluated at its end)
    std::vector<std::string> r;
    for (const auto& j : ax::test::run_records(out / "metrics.jsonl"))
      if (j.contains("loss")) r.push_back(j.dump());
    return r;
  };
  CHECK(steps(dir / "resumed").size() == 4);
  CHECK(steps(dir / "resumed") == steps(dir / "packed"));
  for (const char* f : {"adapter_model.safetensors", "trainer_state.safetensors"})
    CHECK(ax::test::slurp(dir / "resumed" / "checkpoints" / "step-00000004" / f) ==
          ax::test::slurp(dir / "packed" / "checkpoints" / "step-00000004" / f));
  // merge-lora: the record says fp8, the base is decoded (and the log says so); the same model as the merge of
  // the dequantised run's adapter.
  const fs::path adapter = dir / "packed" / "checkpoints" / "step-00000004";
  CHECK(nlohmann::json::parse(ax::test::slurp(adapter / "axengine_training.json"))["base_format"] == "fp8");
  REQUIRE(ax::test::run({"merge-lora", "--adapter", adapter.string(), "--out", (dir / "merged").string()}, dir / "merge.log") == 0);
  CHECK(ax::test::slurp(dir / "merge.log").find("): fp8, then dequantised") != std::string::npos);
  REQUIRE(ax::test::run({"merge-lora", "--adapter", (dir / "dequantised" / "checkpoints" / "step-00000004").string(), "--out",
                         (dir / "merged_dq").string()},
                        dir / "merge_dq.log") == 0);
  auto a = ax::safetensors::Checkpoint::open_dir((dir / "merged").string());
  auto d = ax::safetensors::Checkpoint::open_dir((dir / "merged_dq").string());
  REQUIRE(a.names() == d.names());
  for (const auto& n : a.names()) CHECK(at::equal(a.get(n), d.get(n)));
  CHECK_FALSE(nlohmann::json::parse(ax::test::slurp(dir / "merged" / "config.json")).contains("quantization_config"));
  ax::test::remove_tree(dir);
}
