// Context parallelism end to end on Gloo ([distributed] context_parallel, docs/distributed.md): 2 ranks splitting
// every row train what one process trains (a llama, a deepseek_v3 with MLA, a qwen3_5 with Gated DeltaNet layers),
// and 4 ranks as 2 data-parallel x 2 context-parallel train what one process with grad_accum 2 trains (losses and
// grad norms to 1e-6, the adapter as the data-parallel tests compare it); and the key's checks at validate.
// In-process gradient equality per tensor: context_parallel_test.cpp, context_parallel_gdn_test.cpp.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "axengine/config.hpp"
#include "train/dist_config.hpp"
#include "train/dist_context.hpp"
#include "unit/cli_util.hpp"
#include "unit/dist_compare.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

// As dist_test.cpp: the CPU and Gloo on every machine, one intra-op thread, evaluation on (its forwards gather).
const std::vector<std::string> kCpCommon{"train.schedule=constant", "train.log_every=1", "eval.every_steps=2",
                                         "eval.exact_match=false",  "distributed.timeout_s=60", "train.cpu_threads=1",
                                         "train.max_steps=4",       "device.type=cpu"};

int run_cli(const fs::path& dir, const std::vector<std::string>& head, const std::vector<std::string>& sets, const std::string& log) {
  std::vector<std::string> args = head;
  for (const auto& s : kCpCommon) args.insert(args.end(), {"--set", s});
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  int rc = ax::test::run(args, dir / log);
  if (rc != 0) MESSAGE(slurp(dir / log));
  return rc;
}

std::vector<double> field(const fs::path& out, const char* key) {
  std::vector<double> v;
  for (const auto& r : ax::test::step_records(out / "metrics.jsonl")) v.push_back(r[key].get<double>());
  return v;
}

std::vector<double> eval_losses(const fs::path& out) {
  std::vector<double> v;
  for (const auto& line : ax::test::lines_of(out / "metrics.jsonl")) {
    auto r = nlohmann::json::parse(line);
    if (r.contains("eval_loss")) v.push_back(r["eval_loss"].get<double>());
  }
  return v;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  REQUIRE(!want.empty());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::abs(want[i])));
  }
}

void check_same_run(const fs::path& got, const fs::path& want) {
  check_close(field(got, "loss"), field(want, "loss"));
  // Step 1's gradient norm is taken before any update: the reduced gradients themselves, not Adam's view of them.
  CHECK(std::abs(field(got, "grad_norm")[0] - field(want, "grad_norm")[0]) <= 1e-6 * field(want, "grad_norm")[0]);
  check_close(eval_losses(got), eval_losses(want));
  ax::test::check_same_adapter(got, want, 4);
  CHECK(field(got, "tokens") == field(want, "tokens"));
}

}  // namespace

TEST_CASE("context parallel: 2 ranks splitting every row train what 1 process trains") {
  auto dir = ax::test::setup_run("dist_cp2", "");
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run_cli(dir, {"run", "--config", cfg}, {"run.output_dir=one"}, "one.log") == 0);
  REQUIRE(run_cli(dir, {"launch", "--nproc", "2", "--", "run", "--config", cfg},
                  {"run.output_dir=two", "distributed.context_parallel=2"}, "two.log") == 0);
  const std::string two = slurp(dir / "two.log");
  INFO(two);
  CHECK(two.find("context parallel: group 0 (ranks 0..1), chunks 0 and 3 of 4 of every row (ring attention)") != std::string::npos);
  check_same_run(dir / "two", dir / "one");
  ax::test::remove_tree(dir);
}

TEST_CASE("context parallel: 4 ranks as 2 data-parallel x 2 context-parallel train what 1 process with grad_accum 2 trains") {
  auto dir = ax::test::setup_run("dist_cp4", "");
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run_cli(dir, {"run", "--config", cfg}, {"run.output_dir=one", "train.grad_accum=2"}, "one.log") == 0);
  REQUIRE(run_cli(dir, {"launch", "--nproc", "4", "--", "run", "--config", cfg},
                  {"run.output_dir=four", "distributed.context_parallel=2", "train.activation_checkpointing=true"},
                  "four.log") == 0);
  const std::string four = slurp(dir / "four.log");
  INFO(four);
  CHECK(four.find("context parallel: group 0 (ranks 0..1), chunks 0 and 3 of 4 of every row (ring attention)") != std::string::npos);
  check_same_run(dir / "four", dir / "one");
  ax::test::remove_tree(dir);
}

namespace {

// One process against 2 ranks splitting every row, on the tiny model of `preset` with LoRA on `targets`.
void check_two_ranks_on(const std::string& run_name, const std::string& preset, const std::string& targets, const std::string& family) {
  auto dir = ax::test::setup_run(run_name, "");
  REQUIRE(ax::test::run({"init-model", "--preset", preset, "--out", (dir / "tiny").string()}, dir / "init.log") == 0);
  const std::string cfg = (dir / "run.toml").string();
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), {"model.path=tiny", "lora.targets=" + targets});
    return sets;
  };
  REQUIRE(run_cli(dir, {"run", "--config", cfg}, with({"run.output_dir=one"}), "one.log") == 0);
  REQUIRE(run_cli(dir, {"launch", "--nproc", "2", "--", "run", "--config", cfg},
                  with({"run.output_dir=two", "distributed.context_parallel=2"}), "two.log") == 0);
  const std::string two = slurp(dir / "two.log");
  INFO(two);
  CHECK(two.find("loaded " + family + " model") != std::string::npos);
  CHECK(two.find("chunks 0 and 3 of 4 of every row (ring attention)") != std::string::npos);
  check_same_run(dir / "two", dir / "one");
  ax::test::remove_tree(dir);
}

}  // namespace

TEST_CASE("context parallel: 2 ranks train what 1 process trains on a multi-head latent attention model (deepseek_v3)") {
  // The MLA blocks (qk and v head dims differ, the shared rope key split with the tokens) through the ring.
  check_two_ranks_on("dist_cp_mla", "tiny-deepseek-v3", "[\"q_a_proj\", \"kv_b_proj\", \"o_proj\"]", "deepseek_v3");
}

TEST_CASE("context parallel: 2 ranks train what 1 process trains on a Gated DeltaNet hybrid (qwen3_5)") {
  // The linear-attention layer's conv1d window and recurrent state handed from rank to rank along each row.
  check_two_ranks_on("dist_cp_gdn", "tiny-qwen3_5", "[\"q_proj\", \"in_proj_qkv\", \"in_proj_z\", \"out_proj\"]", "qwen3_5");
}

TEST_CASE("context parallel: the key is checked against the world, the row length, other splits and the family") {
  auto dir = ax::test::scratch_dir("dist_cp_check");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen3-moe", "--out", (dir / "moe").string()}, dir / "init.log") == 0);
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-deepseek-v3", "--out", (dir / "mla").string()}, dir / "init2.log") == 0);
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen3_5", "--out", (dir / "gdn").string()}, dir / "init3.log") == 0);
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen2_5-vl", "--out", (dir / "vl").string()}, dir / "init4.log") == 0);
  auto error_of = [&](const std::string& model, int64_t n, int64_t world, int64_t seq, const std::string& more = "") {
    std::ofstream(dir / "run.toml") << "[model]\npath = \"" << model << "\"\n[distributed]\ncontext_parallel = " << n << "\n" << more;
    try {
      auto c = ax::load_config(dir / "run.toml", {});
      ax::train::DistEnv env;
      env.launched = true;
      env.world = world;
      ax::train::check_context_parallel(c, ax::train::read_distributed_config(c), env, seq);
    } catch (const std::runtime_error& e) {
      std::string m = e.what();
      auto at = m.find("run.toml");
      return at == std::string::npos ? m : m.substr(at);
    }
    return std::string();
  };
  CHECK(error_of("moe", 2, 4, 64).empty());  // MoE: its aux loss over the gathered router logits
  CHECK(error_of("moe", 3, 4, 66).rfind("run.toml:4:20: 'distributed.context_parallel' = 3: it must divide the world size 4", 0) == 0);
  CHECK(error_of("moe", 4, 4, 66).find("2 x N must divide data.sequence_len = 66") != std::string::npos);
  CHECK(error_of("moe", 2, 4, 66).find("2 x N must divide data.sequence_len = 66") != std::string::npos);  // 2 chunks each
  CHECK(error_of("moe", 2, 4, 64, "expert_parallel = 2\n").find("not together with expert_parallel = 2") != std::string::npos);
  CHECK(error_of("moe", 2, 4, 64, "shard_base = true\n").find("not together with shard_base") != std::string::npos);
  CHECK(error_of("mla", 2, 2, 64).empty());  // MLA's per-head k and v go through the ring as any attention's
  CHECK(error_of("gdn", 2, 2, 64).empty());  // Gated DeltaNet: window and state handed from chunk to chunk
  CHECK(error_of("gdn", 2, 2, 8).find("Gated DeltaNet conv1d window (linear_conv_kernel_dim = 4) reaches past a chunk of "
                                      "data.sequence_len / 2N = 2 tokens") != std::string::npos);
  CHECK(error_of("vl", 2, 2, 64).find("(qwen2_5_vl): a vision-language model splices vision features") != std::string::npos);
  // Qwen3.5's multimodal checkpoint form is read for its language model (the tower not read): a text decoder.
  CHECK(error_of((fs::path(AXENGINE_TEST_DATA_DIR) / "models" / "qwen3_5_vl").string(), 2, 2, 64).empty());
  CHECK(error_of("moe", 0, 2, 64).rfind("run.toml:4:20: 'distributed.context_parallel'", 0) == 0);
  // Not launched: the table has no effect, nothing to check.
  std::ofstream(dir / "run.toml") << "[model]\npath = \"mla\"\n[distributed]\ncontext_parallel = 2\n";
  auto c = ax::load_config(dir / "run.toml", {});
  CHECK_NOTHROW(ax::train::check_context_parallel(c, ax::train::read_distributed_config(c), ax::train::DistEnv{}, 64));
  ax::test::remove_tree(dir);
}
