// Expert parallelism end to end on Gloo ([distributed] expert_parallel, docs/distributed.md): 2 ranks, each
// holding half the experts of the tiny Qwen3-MoE, train what one process with grad_accum 2 trains (losses and
// the full adapter, gathered from both ranks), with fewer base bytes resident; and the key's checks.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "axengine/config.hpp"
#include "axengine/safetensors.hpp"
#include "train/dist_config.hpp"
#include "train/dist_expert.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

const std::vector<std::string> kEpCommon{"model.path=moe",      "train.schedule=constant", "train.log_every=1",
                                         "eval.every_steps=0",  "eval.exact_match=false",  "distributed.timeout_s=60",
                                         "train.cpu_threads=1", "train.max_steps=4",
                                         "device.type=cpu"};  // Gloo on the CPU, also on a GPU machine

int run_cli(const fs::path& dir, const std::vector<std::string>& head, const std::vector<std::string>& sets, const std::string& log) {
  std::vector<std::string> args = head;
  for (const auto& s : kEpCommon) args.insert(args.end(), {"--set", s});
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  int rc = ax::test::run(args, dir / log);
  if (rc != 0) MESSAGE(slurp(dir / log));
  return rc;
}

std::vector<double> losses_of(const fs::path& out) {
  std::vector<double> v;
  for (const auto& r : ax::test::step_records(out / "metrics.jsonl")) v.push_back(r["loss"].get<double>());
  return v;
}

// "base weights    dense: ... resident (N bytes)" from the summary.
int64_t resident_bytes(const std::string& log) {
  auto at = log.find(" resident (");
  REQUIRE(at != std::string::npos);
  return std::stoll(log.substr(at + 11));
}

// The adapters two runs wrote at step 4 hold the same tensors (to fp32 rounding of the reductions); returns how
// many of them are experts'.
int same_adapters(const fs::path& a_run, const fs::path& b_run) {
  auto a = ax::safetensors::File::open((a_run / "checkpoints/step-00000004/adapter_model.safetensors").string());
  auto b = ax::safetensors::File::open((b_run / "checkpoints/step-00000004/adapter_model.safetensors").string());
  REQUIRE(a->tensors().size() == b->tensors().size());
  int experts = 0;
  for (const auto& info : b->tensors()) {
    CAPTURE(info.name);
    experts += info.name.find(".mlp.experts.") != std::string::npos;
    at::Tensor x = a->get(info.name).to(at::kFloat), y = b->get(info.name).to(at::kFloat);
    REQUIRE(x.sizes() == y.sizes());
    CHECK((x - y).abs().max().item<double>() / std::max(1e-6, y.abs().max().item<double>()) < 1e-4);
  }
  return experts;
}

}  // namespace

TEST_CASE("expert parallel: 2 ranks holding half the experts each train what 1 process with grad_accum 2 trains") {
  auto dir = ax::test::setup_run("dist_ep2", "");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen3-moe", "--out", (dir / "moe").string()}, dir / "init.log") == 0);
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run_cli(dir, {"run", "--config", cfg}, {"run.output_dir=one", "train.grad_accum=2"}, "one.log") == 0);
  REQUIRE(run_cli(dir, {"launch", "--nproc", "2", "--", "run", "--config", cfg},
                  {"run.output_dir=two", "distributed.expert_parallel=2"}, "two.log") == 0);
  const std::string one = slurp(dir / "one.log"), two = slurp(dir / "two.log");
  INFO(two);
  CHECK(two.find("expert parallel: group 0 (ranks 0..1), position 0 of 2") != std::string::npos);
  // Rank 0 holds 3 of the 6 experts of each layer: exactly half the expert bytes fewer than one process.
  // tiny-qwen3-moe: 2 layers x (gate_up [6, 2*32, 64] + down [6, 64, 32]) fp32 = 294912 bytes of experts.
  CHECK(resident_bytes(one) - resident_bytes(two) == 294912 / 2);

  const auto got = losses_of(dir / "two"), want = losses_of(dir / "one");
  REQUIRE(got.size() == 4);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  // The adapter rank 0 wrote holds every expert (gathered), in the single-process (peft) layout.
  CHECK(same_adapters(dir / "two", dir / "one") == 2 * 4);  // 2 layers x (gate_up, down) x (A, B)
  ax::test::remove_tree(dir);
}

// DeepSeek-V3's layout (MLA, the group-limited sigmoid router with its correction bias, shared experts, a dense
// first layer): the router runs on every rank over all 8 experts, each rank computes its 4.
TEST_CASE("expert parallel: deepseek_v3 on 2 ranks trains what 1 process with grad_accum 2 trains") {
  auto dir = ax::test::setup_run("dist_ep2_deepseek", "");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-deepseek-v3", "--out", (dir / "moe").string()}, dir / "init.log") == 0);
  const std::string cfg = (dir / "run.toml").string();
  const std::string targets = "lora.targets=[\"q_a_proj\", \"kv_b_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]";
  REQUIRE(run_cli(dir, {"run", "--config", cfg}, {"run.output_dir=one", "train.grad_accum=2", targets}, "one.log") == 0);
  REQUIRE(run_cli(dir, {"launch", "--nproc", "2", "--", "run", "--config", cfg},
                  {"run.output_dir=two", "distributed.expert_parallel=2", targets}, "two.log") == 0);
  const auto got = losses_of(dir / "two"), want = losses_of(dir / "one");
  REQUIRE(got.size() == 4);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  CHECK(same_adapters(dir / "two", dir / "one") == 1 * 4);  // 1 sparse layer x (gate_up, down) x (A, B)
  ax::test::remove_tree(dir);
}

TEST_CASE("expert parallel: 4 ranks in 2 groups of 2 train what 1 process with grad_accum 4 trains") {
  // Two expert-parallel groups: the expert shards' gradients are also reduced across the groups (ranks 0 and
  // 2 hold the same experts, 1 and 3 the others), the replicated parameters over all four.
  auto dir = ax::test::setup_run("dist_ep4", "");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen3-moe", "--out", (dir / "moe").string()}, dir / "init.log") == 0);
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run_cli(dir, {"run", "--config", cfg}, {"run.output_dir=one", "train.grad_accum=4"}, "one.log") == 0);
  REQUIRE(run_cli(dir, {"launch", "--nproc", "4", "--", "run", "--config", cfg},
                  {"run.output_dir=four", "distributed.expert_parallel=2"}, "four.log") == 0);
  INFO(slurp(dir / "four.log"));
  const auto got = losses_of(dir / "four"), want = losses_of(dir / "one");
  REQUIRE(got.size() == 4);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  auto a = ax::safetensors::File::open((dir / "four/checkpoints/step-00000004/adapter_model.safetensors").string());
  auto b = ax::safetensors::File::open((dir / "one/checkpoints/step-00000004/adapter_model.safetensors").string());
  REQUIRE(a->tensors().size() == b->tensors().size());
  for (const auto& info : b->tensors()) {
    CAPTURE(info.name);
    at::Tensor x = a->get(info.name).to(at::kFloat), y = b->get(info.name).to(at::kFloat);
    REQUIRE(x.sizes() == y.sizes());
    CHECK((x - y).abs().max().item<double>() / std::max(1e-6, y.abs().max().item<double>()) < 1e-4);
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("expert parallel: the key is checked against the world, the experts, resume and exact_match") {
  auto dir = ax::test::scratch_dir("dist_ep_check");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen3-moe", "--out", (dir / "moe").string()}, dir / "init.log") == 0);
  auto error_of = [&](int64_t n, int64_t world, bool resuming, bool exact_match) {
    std::ofstream(dir / "run.toml") << "[model]\npath = \"moe\"\n[distributed]\nexpert_parallel = " << n << "\n";
    try {
      auto cfg = ax::load_config(dir / "run.toml", {});
      ax::train::DistEnv env;
      env.launched = true;
      env.world = world;
      ax::train::check_expert_parallel(cfg, ax::train::read_distributed_config(cfg), env, resuming, exact_match);
    } catch (const std::runtime_error& e) {
      std::string m = e.what();
      auto at = m.find("run.toml");
      return at == std::string::npos ? m : m.substr(at);
    }
    return std::string();
  };
  CHECK(error_of(2, 4, false, false).empty());
  CHECK(error_of(3, 4, false, false).rfind("run.toml:4:19: 'distributed.expert_parallel' = 3: it must divide the world size 4", 0) == 0);
  CHECK(error_of(4, 4, false, false).find("it must divide the model's 6 experts") != std::string::npos);
  CHECK(error_of(2, 2, true, false).find("resuming an expert-parallel run is not built yet") != std::string::npos);
  CHECK(error_of(2, 2, false, true).find("eval.exact_match") != std::string::npos);
  CHECK(error_of(0, 2, false, false).rfind("run.toml:4:19: 'distributed.expert_parallel'", 0) == 0);
  ax::test::remove_tree(dir);
}
