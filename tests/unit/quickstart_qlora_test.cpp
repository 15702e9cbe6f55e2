// The quickstart as a QLoRA run, end to end through the CLI on a CPU: what scripts/quickstart.sh does (init-model
// --preset tiny-llama, make-data of one-digit sums, `run` on the shipped configs/quickstart.toml) with the base
// packed to nf4 (double_quant), then merge-lora with the same config. (Issue 18, item 4: "the quickstart-sized
// test trains a tiny model with nf4 on CPU".)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <ATen/ATen.h>

#include "axengine/ops/quant.hpp"
#include "axengine/safetensors.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;

namespace {

// The figures docs/weights.md quotes for exactly this model and config: the test keeps the doc honest.
constexpr const char* kDocLine =
    "73728 of 94528 parameters packed at 0.530 bytes/param";

}  // namespace

TEST_CASE("quickstart qlora: the shipped quickstart config trains tiny-llama on an nf4 base on CPU and merges dense") {
  using ax::test::run;
  using ax::test::slurp;
  auto dir = ax::test::scratch_dir("quickstart_qlora");
  // The layout the shipped config assumes, relative to configs/: ../runs/quickstart-model, ../runs/quickstart-data.
  const fs::path model = dir / "runs/quickstart-model", data = dir / "runs/quickstart-data";
  REQUIRE(run({"init-model", "--preset", "tiny-llama", "--out", model.string()}, dir / "init.log") == 0);
  REQUIRE(run({"make-data", "--task", "arithmetic", "--out", data.string(), "--train", "80", "--eval", "20", "--digits", "1"},
              dir / "make-data.log") == 0);
  // The weight keys go into the config file itself: merge-lora --config must find them there, as a user's would.
  std::string text = slurp(std::string(AXENGINE_SOURCE_DIR) + "/configs/quickstart.toml");
  const auto at = text.find("[model]\n");
  REQUIRE(at != std::string::npos);
  text.insert(at + 8, "weight_format = \"nf4\"\ndouble_quant = true\n");
  fs::create_directories(dir / "configs");
  const std::string cfg = (dir / "configs/quickstart-qlora.toml").string();
  std::ofstream(cfg) << text;

  // The shipped 300 steps, cut to 100 to keep the CPU suite quick; eval (every 25) and checkpoints (every 100)
  // as shipped, so the adapter of the last step is a checkpoint. On the CPU also on a GPU machine: the figures
  // below are those of the fp32 CPU run (a GPU would compute in bf16 and pick its own kernels).
  int rc = run({"run", "--config", cfg, "--set", "train.max_steps=100", "--set", "device.type=cpu"}, dir / "run.log");
  const std::string log = slurp(dir / "run.log");
  INFO(log);
  REQUIRE(rc == 0);
  // The packed base, reported twice: by the model as it loads, and in the end-of-run summary.
  CHECK(log.find("base weights: 73728 of 94528 parameters in nf4 (0.530 bytes/param incl. scales)") != std::string::npos);
  const auto summary = log.find("  base weights    nf4: ");
  REQUIRE(summary != std::string::npos);
  const std::string line = log.substr(summary, log.find('\n', summary) - summary);
  MESSAGE(line);
  CHECK(line.find(kDocLine) != std::string::npos);
  CHECK(line.find("resident (122296 bytes), peak 151.2 KiB (154808 bytes) while loading") != std::string::npos);
  CHECK(std::regex_search(log, std::regex(R"(quantize +reference +nf4)")));
  CHECK(std::regex_search(log, std::regex(R"(linear\.lora +reference +fp32,nf4)")));  // CPU: the fp32 reference

  // It learns: the mean training loss of the last 10 steps is well under that of the first 10, eval loss falls
  // and the greedy answers to the held-out sums start coming out right (0 % at step 0; 15 % at step 100 today).
  auto steps = ax::test::step_records(dir / "runs/quickstart/metrics.jsonl");
  REQUIRE(steps.size() == 100);
  auto mean_loss = [&](size_t from) {
    double s = 0;
    for (size_t i = from; i < from + 10; ++i) s += steps[i]["loss"].get<double>();
    return s / 10;
  };
  CHECK(mean_loss(90) < 0.7 * mean_loss(0));
  std::vector<nlohmann::json> evals;
  for (const auto& l : ax::test::lines_of(dir / "runs/quickstart/metrics.jsonl")) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("eval_loss")) evals.push_back(j);
  }
  REQUIRE(evals.size() == 5);  // steps 0, 25, 50, 75, 100
  CHECK(evals.back()["eval_loss"].get<double>() < 0.5 * evals.front()["eval_loss"].get<double>());
  CHECK(evals.back()["exact_match"].get<double>() > 0);

  // The adapter: a PEFT LoRA adapter like any other, fp32 (lora.dtype's default).
  const fs::path adapter = dir / "runs/quickstart/checkpoints/step-00000100";
  REQUIRE(fs::is_regular_file(adapter / "adapter_config.json"));
  auto a = ax::safetensors::File::open((adapter / "adapter_model.safetensors").string());
  CHECK(a->tensors().size() == 2 * 7 * 2);  // tiny-llama: 2 layers x 7 targets x (A, B)
  for (const auto& t : a->tensors()) CHECK((t.scalar_type == at::kFloat));

  // merge-lora with the run's config rebuilds the nf4 base, dequantises it and writes a dense model.
  rc = run({"merge-lora", "--config", cfg, "--adapter", adapter.string(), "--out", (dir / "merged").string()}, dir / "merge.log");
  const std::string merge_log = slurp(dir / "merge.log");
  INFO(merge_log);
  REQUIRE(rc == 0);
  CHECK(merge_log.find("(nf4 base, dequantised)") != std::string::npos);
  // The merged weight is the base the adapter trained against, nf4 and back, plus (alpha / r) B A: recomputed
  // here from the base checkpoint and the adapter file. Unpacked tensors (embeddings, norms) pass through as stored.
  auto base = ax::safetensors::File::open((model / "model.safetensors").string());
  auto merged = ax::safetensors::File::open((dir / "merged/model.safetensors").string());
  for (const std::string leaf : {"self_attn.q_proj", "mlp.down_proj"}) {
    CAPTURE(leaf);
    const std::string w = "model.layers.1." + leaf + ".weight", lora = "base_model.model.model.layers.1." + leaf;
    at::Tensor packed_then_dense = ax::ops::dequantize(ax::ops::quantize_nf4(base->get(w), 64, true), at::kFloat);
    at::Tensor expect = packed_then_dense + (64.0 / 32.0) * at::matmul(a->get(lora + ".lora_B.weight"), a->get(lora + ".lora_A.weight"));
    CHECK(at::allclose(merged->get(w), expect, 1e-5, 1e-6));
    CHECK_FALSE(at::equal(merged->get(w), packed_then_dense));  // the adapter did move it
  }
  CHECK(at::equal(merged->get("model.embed_tokens.weight"), base->get("model.embed_tokens.weight")));
  // inspect reads the merged dir as an ordinary dense model: every tensor fp32 (the base's dtype), all used.
  rc = run({"inspect", (dir / "merged").string()}, dir / "inspect.log");
  const std::string inspect = slurp(dir / "inspect.log");
  INFO(inspect);
  REQUIRE(rc == 0);
  CHECK(inspect.find("model.layers.1.self_attn.q_proj.weight  F32") != std::string::npos);
  CHECK(inspect.find("(not used)") == std::string::npos);
  CHECK(inspect.find(" BF16 ") == std::string::npos);
  CHECK(inspect.find(" U8 ") == std::string::npos);
  ax::test::remove_tree(dir);
}
