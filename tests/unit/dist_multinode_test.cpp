// What docs/distributed.md documents beyond one launcher, run for real on Gloo over loopback (no GPU): two
// "nodes" (two `axengine launch --nnodes 2 --node-rank I` processes sharing a --master rendezvous, as on two
// machines) train what one process accumulating the same micro-batches trains; and expert parallelism over a
// base quantised at load (`model.weight_format = "nf4"` with `[distributed] expert_parallel`) does too, while nf4's
// double quantisation, which it cannot reproduce per rank, is refused.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "unit/cli_util.hpp"
#include "unit/dist_compare.hpp"
#include "unit/free_port.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

// Constant lr after warmup, one intra-op thread (the same sums in every process), the CPU and Gloo also on a GPU
// machine, no evaluation on the way.
const std::vector<std::string> kCommon{"train.schedule=constant", "train.log_every=1",     "eval.every_steps=0",
                                       "eval.exact_match=false",  "distributed.timeout_s=60", "train.cpu_threads=1",
                                       "device.type=cpu"};

std::vector<std::string> with_sets(std::vector<std::string> args, const std::vector<std::string>& more) {
  std::vector<std::string> sets = kCommon;
  sets.insert(sets.end(), more.begin(), more.end());
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

int run_logged(const fs::path& dir, const std::vector<std::string>& args, const std::string& log) {
  int rc = ax::test::run(args, dir / log);
  if (rc != 0) MESSAGE(slurp(dir / log));
  return rc;
}

// "base weights    ...: ... resident (N bytes)" from the run's summary.
int64_t resident_bytes(const std::string& log) {
  auto at = log.find(" resident (");
  REQUIRE(at != std::string::npos);
  return std::stoll(log.substr(at + 11));
}

}  // namespace

TEST_CASE("distributed: two nodes (a launcher each, --nnodes 2 --node-rank 0/1) train what 1 process with grad_accum 4 trains") {
  auto dir = ax::test::setup_run("dist_two_nodes", "max_steps = 4\n");
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run_logged(dir, with_sets({"run", "--config", cfg}, {"run.output_dir=one", "train.grad_accum=4"}), "one.log") == 0);

  // Two launchers of 2 ranks each, as on two machines: node 0 hosts the rendezvous at --master.
  const std::string master = "127.0.0.1:" + std::to_string(ax::test::free_tcp_port());
  std::vector<pid_t> nodes;
  for (const char* node : {"0", "1"}) {
    auto args = with_sets({"launch", "--nproc", "2", "--nnodes", "2", "--node-rank", node, "--master", master, "--grace-s", "10",
                           "--", "run", "--config", cfg},
                          {"run.output_dir=nodes"});
    nodes.push_back(ax::test::spawn(args, dir / ("node" + std::string(node) + ".log")));
  }
  bool ok = true;
  for (pid_t p : nodes) {
    int status = 0;
    ::waitpid(p, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const std::string log0 = slurp(dir / "node0.log"), log1 = slurp(dir / "node1.log");
  INFO("node 0:\n" << log0);
  INFO("node 1:\n" << log1);
  REQUIRE(ok);
  // RANK = node_rank * nproc + local rank: node 1 runs ranks 2 and 3 of 4, joining node 0's rendezvous.
  CHECK(log0.find("launch: ranks 0..1 of 4, rendezvous at " + master) != std::string::npos);
  CHECK(log1.find("launch: ranks 2..3 of 4, rendezvous at " + master) != std::string::npos);
  CHECK(log0.find("[rank 0/4] distributed: rank 0 of 4") != std::string::npos);
  CHECK(log0.find("done: 4 steps") != std::string::npos);  // rank 0 speaks for the group; ranks 2 and 3 only warn
  CHECK(log1.find("[I] [rank 0/4]") == std::string::npos);
  for (const std::string* log : {&log0, &log1}) CHECK(log->find("launch: all 2 ranks finished") != std::string::npos);
  ax::test::check_same_losses(ax::test::losses(dir / "nodes"), ax::test::losses(dir / "one"));
  ax::test::check_same_adapter(dir / "nodes", dir / "one", 4);
  ax::test::remove_tree(dir);
}

TEST_CASE("expert parallel: 2 ranks on an nf4 base quantised at load train what 1 process (nf4, grad_accum 2) trains") {
  auto dir = ax::test::setup_run("dist_ep_nf4", "max_steps = 4\n");
  REQUIRE(ax::test::run({"init-model", "--preset", "tiny-qwen3-moe", "--out", (dir / "moe").string()}, dir / "init.log") == 0);
  const std::string cfg = (dir / "run.toml").string();
  const std::vector<std::string> nf4{"model.path=moe", "model.weight_format=nf4"};
  auto sets = [&](std::vector<std::string> more) {
    more.insert(more.begin(), nf4.begin(), nf4.end());
    return more;
  };
  REQUIRE(run_logged(dir, with_sets({"run", "--config", cfg}, sets({"run.output_dir=one", "train.grad_accum=2"})), "one.log") == 0);
  REQUIRE(run_logged(dir, with_sets({"launch", "--nproc", "2", "--grace-s", "10", "--", "run", "--config", cfg},
                                    sets({"run.output_dir=two", "distributed.expert_parallel=2"})),
                     "two.log") == 0);
  const std::string one = slurp(dir / "one.log"), two = slurp(dir / "two.log");
  INFO(two);
  CHECK(two.find("expert parallel: group 0 (ranks 0..1), position 0 of 2") != std::string::npos);
  // Both quantised the base at load, and rank 0 holds half the packed experts.
  for (const std::string* log : {&one, &two}) CHECK(log->find("base weights    nf4: ") != std::string::npos);
  CHECK(resident_bytes(two) < resident_bytes(one));
  // Every nf4 block is quantised on its own, so each rank's experts hold one process's bits: the same losses.
  ax::test::check_same_losses(ax::test::losses(dir / "two"), ax::test::losses(dir / "one"));
  ax::test::check_same_adapter(dir / "two", dir / "one", 4);
  // Double quantisation takes statistics over the whole expert tensor, which no rank quantises whole: refused by
  // name before any weight is read (it trained adapters 30 % of their scale away from one process's). Rank 0 says
  // why (exit 2); the launcher's code is whichever rank stopped first (rank 1's barrier may see rank 0 go).
  CHECK(ax::test::run(with_sets({"launch", "--nproc", "2", "--grace-s", "10", "--", "run", "--config", cfg},
                                sets({"run.output_dir=dq", "distributed.expert_parallel=2", "model.double_quant=true"})),
                      dir / "dq.log") != 0);
  CHECK(slurp(dir / "dq.log").find("'distributed.expert_parallel' = 2: model.double_quant = true is not built for expert "
                                   "parallelism yet") != std::string::npos);
  CHECK(!fs::exists(dir / "dq/checkpoints"));
  ax::test::remove_tree(dir);
}
