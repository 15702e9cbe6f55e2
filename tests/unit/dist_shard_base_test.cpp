// [distributed] shard_base end to end on Gloo (train/dist_shard_base.hpp, docs/distributed.md): ranks that
// keep 1/N of every layer's frozen tensors and gather a layer per use train exactly what the same ranks
// holding the whole base train (losses, eval losses, adapter), dense and nf4, 2 and 3 ranks, through a
// resume; the resident base bytes are measured; the key's checks.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "axengine/config.hpp"
#include "axengine/safetensors.hpp"
#include "train/dist_config.hpp"
#include "train/dist_shard_base.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

// The CPU and Gloo on every machine (on a GPU machine "auto" would pick NCCL); one intra-op thread: the same
// sums in every process.
const std::vector<std::string> kShardCommon{"train.schedule=constant", "train.log_every=1", "eval.exact_match=false",
                                            "distributed.timeout_s=60", "train.cpu_threads=1", "device.type=cpu",
                                            "checkpoint.every_steps=2"};

// `axengine launch --nproc n -- run` with kShardCommon and `sets`; its log in dir/<log>.
int launch(const fs::path& dir, int n, const std::vector<std::string>& sets, const std::string& log) {
  std::vector<std::string> args{"launch", "--nproc", std::to_string(n), "--", "run", "--config", (dir / "run.toml").string()};
  for (const auto& s : kShardCommon) args.insert(args.end(), {"--set", s});
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  int rc = ax::test::run(args, dir / log);
  if (rc != 0) MESSAGE(slurp(dir / log));
  return rc;
}

// The step losses of metrics.jsonl.
std::vector<double> losses_of(const fs::path& out) {
  std::vector<double> v;
  for (const auto& r : ax::test::step_records(out / "metrics.jsonl")) v.push_back(r["loss"].get<double>());
  return v;
}

// The eval losses of metrics.jsonl, in order.
std::vector<double> eval_losses(const fs::path& out) {
  std::vector<double> v;
  for (const auto& line : ax::test::lines_of(out / "metrics.jsonl")) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_loss") && j["eval_loss"].is_number()) v.push_back(j["eval_loss"].get<double>());
  }
  return v;
}

// Bit for bit: the same ops on the same values in the same order (the recomputation in backward included).
void check_same_adapter(const fs::path& got_out, const fs::path& want_out, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  auto got = ax::safetensors::File::open((got_out / "checkpoints" / name / "adapter_model.safetensors").string());
  auto want = ax::safetensors::File::open((want_out / "checkpoints" / name / "adapter_model.safetensors").string());
  REQUIRE(got->tensors().size() == want->tensors().size());
  for (const auto& info : want->tensors()) {
    CAPTURE(info.name);
    CHECK(at::equal(got->get(info.name), want->get(info.name)));
  }
}

// "base weights ...: ... resident (N bytes)" of rank 0's summary.
int64_t resident_bytes(const std::string& log) {
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex(" resident \\((\\d+) bytes\\)")));
  return std::stoll(m[1]);
}

// Runs `world` ranks with and without shard_base (`sets` for both) and checks that they train the same and
// that a rank holds 1/world of the layers' bytes.
void check_sharded_equals_whole(const fs::path& dir, int world, const std::vector<std::string>& sets, int steps) {
  std::vector<std::string> whole = sets, sharded = sets;
  whole.push_back("run.output_dir=whole");
  sharded.insert(sharded.end(), {"run.output_dir=sharded", "distributed.shard_base=true"});
  REQUIRE(launch(dir, world, whole, "whole.log") == 0);
  REQUIRE(launch(dir, world, sharded, "sharded.log") == 0);
  const std::string log = slurp(dir / "sharded.log");
  INFO(log);
  const auto got = losses_of(dir / "sharded"), want = losses_of(dir / "whole");
  REQUIRE(got.size() == static_cast<std::size_t>(steps));
  CHECK(got == want);  // bit for bit
  CHECK(eval_losses(dir / "sharded") == eval_losses(dir / "whole"));
  check_same_adapter(dir / "sharded", dir / "whole", steps);

  // Memory: "shard_base: the L layers' frozen tensors sharded over N ranks: R base bytes resident on this
  // rank (W whole), of which S are its share of the layers". The layers' bytes are W - (R - S); a rank's
  // share is 1/N of them plus the 64-byte alignment of each tensor in its layer's buffer and, with nf4
  // double quantisation, one copy per layer of the 1 KiB code the whole model shares, cut N ways.
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex("shard_base: the (\\d+) layers' frozen tensors sharded over (\\d+) ranks: (\\d+) "
                                               "base bytes resident on this rank \\((\\d+) whole\\), of which (\\d+) are")));
  const int64_t layers = std::stoll(m[1]), ranks = std::stoll(m[2]), resident = std::stoll(m[3]), whole_bytes = std::stoll(m[4]),
                share = std::stoll(m[5]);
  CHECK(ranks == world);
  CHECK(whole_bytes == resident_bytes(slurp(dir / "whole.log")));  // the unsharded run's figure
  CHECK(resident == resident_bytes(log));                           // the summary shows the sharded one
  const int64_t layer_bytes = whole_bytes - (resident - share);
  MESSAGE("shard_base over ", world, " ranks: base ", whole_bytes, " -> ", resident, " bytes resident per rank; the ", layers,
          " layers' ", layer_bytes, " bytes -> ", share);
  CHECK(layer_bytes > 0);
  CHECK(share * world >= layer_bytes);
  CHECK(share * world - layer_bytes <= layers * (64 * 32 + 1024 + world));  // at most 32 tensors a layer here
  // The prefetch: each pass (a forward, a backward's recomputation) gathers its first layer on the spot and
  // every other one ahead.
  REQUIRE(std::regex_search(log, m, std::regex("shard_base: (\\d+) layer gathers prefetched, (\\d+) on demand")));
  MESSAGE(m[0].str());
  CHECK(std::stoll(m[1]) == std::stoll(m[2]) * (layers - 1));
  CHECK(std::stoll(m[2]) > 0);
}

}  // namespace

TEST_CASE("shard_base: 2 ranks holding half of each layer train what 2 ranks holding the whole base train") {
  auto dir = ax::test::setup_run("dist_shard2", "");
  // 8 layers of hidden 256 (the default tiny-llama's embeddings and lm_head outweigh its 2 layers): the
  // layers are most of the base, as in a real model, and most gathers are prefetched.
  fs::remove_all(dir / "model");
  ax::test::make_tiny_llama(dir / "model", 256, 8);
  // grad_accum 2 (two forwards and backwards a step before the all-reduce) and evaluations, which every
  // rank runs with shard_base.
  check_sharded_equals_whole(dir, 2, {"train.max_steps=4", "train.grad_accum=2", "eval.every_steps=2", "eval.max_rows=6"}, 4);
  ax::test::remove_tree(dir);
}

TEST_CASE("shard_base: 3 ranks with an nf4 base (packed codes and scales sharded) train what 3 unsharded ranks train") {
  auto dir = ax::test::setup_run("dist_shard3", "");
  fs::remove_all(dir / "model");
  ax::test::make_tiny_llama(dir / "model", 256, 8);
  check_sharded_equals_whole(dir, 3, {"train.max_steps=4", "eval.every_steps=0", "model.weight_format=nf4", "model.double_quant=true"}, 4);
  ax::test::remove_tree(dir);
}

TEST_CASE("shard_base: a sharded run resumes from its checkpoint and goes on as one run through") {
  // The checkpoint holds the adapter and the optimizer state, replicated on every rank: nothing of the base.
  auto dir = ax::test::setup_run("dist_shard_resume", "");
  REQUIRE(launch(dir, 2, {"train.max_steps=4", "eval.every_steps=0", "run.output_dir=ref"}, "ref.log") == 0);
  REQUIRE(launch(dir, 2, {"train.max_steps=2", "eval.every_steps=0", "run.output_dir=cut", "distributed.shard_base=true"}, "cut1.log") == 0);
  REQUIRE(launch(dir, 2, {"train.max_steps=4", "eval.every_steps=0", "run.output_dir=cut", "distributed.shard_base=true",
                          "checkpoint.resume_from=latest"}, "cut2.log") == 0);
  INFO(slurp(dir / "cut2.log"));
  CHECK(slurp(dir / "cut2.log").find("resumed from ") != std::string::npos);
  const auto got = losses_of(dir / "cut"), want = losses_of(dir / "ref");
  REQUIRE(want.size() == 4);
  CHECK(got == want);
  check_same_adapter(dir / "cut", dir / "ref", 4);
  ax::test::remove_tree(dir);
}

TEST_CASE("shard_base: the key is checked against expert_parallel and exact_match") {
  auto dir = ax::test::scratch_dir("dist_shard_check");
  auto error_of = [&](const std::string& table, bool exact_match, bool launched = true) {
    std::ofstream(dir / "run.toml") << "[distributed]\n" << table;
    try {
      auto cfg = ax::load_config(dir / "run.toml", {});
      ax::train::DistEnv env;
      env.launched = launched;
      env.world = 2;
      ax::train::check_shard_base(cfg, ax::train::read_distributed_config(cfg), env, exact_match);
    } catch (const std::runtime_error& e) {
      std::string m = e.what();
      auto at = m.find("run.toml");
      return at == std::string::npos ? m : m.substr(at);
    }
    return std::string();
  };
  CHECK(error_of("shard_base = true\n", false).empty());
  CHECK(error_of("shard_base = false\nexpert_parallel = 2\n", true).empty());
  CHECK(error_of("shard_base = true\nexpert_parallel = 2\n", false, false).empty());  // no launcher: no group, no effect
  const std::string with_ep = error_of("shard_base = true\nexpert_parallel = 2\n", false);
  CAPTURE(with_ep);
  CHECK(with_ep.rfind("run.toml:2:14: 'distributed.shard_base' = true: not together with expert_parallel = 2", 0) == 0);
  const std::string with_em = error_of("shard_base = true\n", true);
  CAPTURE(with_em);
  CHECK(with_em.rfind("run.toml:2:14: 'distributed.shard_base' = true: eval.exact_match", 0) == 0);
  const std::string not_bool = error_of("shard_base = 1\n", false);
  CAPTURE(not_bool);
  CHECK(not_bool.rfind("run.toml:2:14: 'distributed.shard_base'", 0) == 0);
  ax::test::remove_tree(dir);
}
