// Data-parallel training on c10d's Gloo backend, with real processes on this machine (no GPU): the torchrun
// environment, `axengine launch`, the [distributed] table, equality with one process accumulating the same
// micro-batches, resume at another world size, and a dead rank stopping the others.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "axengine/config.hpp"
#include "axengine/error.hpp"
#include "axengine/safetensors.hpp"
#include "train/dist_config.hpp"
#include "unit/cli_util.hpp"
#include "unit/dist_compare.hpp"

namespace fs = std::filesystem;
using ax::test::EnvVars;
using ax::test::slurp;
using ax::test::step_records;
using ax::test::check_same_adapter;
using ax::test::check_same_losses;
using ax::test::losses;

namespace {

// A port for one test's rendezvous: distinct per test (they may run side by side under ctest -j) and away
// from torchrun's default 29500.
std::string port_for(int test) { return std::to_string(29600 + 10 * test + (::getpid() % 7)); }

// `axengine run` as rank `rank` of `world`, with torchrun's variables set by hand.
pid_t spawn_rank(const fs::path& dir, int64_t rank, int64_t world, const std::string& port, const std::vector<std::string>& sets,
                 const EnvVars& extra = {}) {
  std::vector<std::string> args{"run", "--config", (dir / "run.toml").string()};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  EnvVars env{{"RANK", std::to_string(rank)},   {"LOCAL_RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(world)},
              {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", port}};
  env.insert(env.end(), extra.begin(), extra.end());
  return ax::test::spawn(args, dir / ("rank" + std::to_string(rank) + ".log"), env);
}

// Runs `world` ranks to the end; true when every one exited 0 (their logs are in dir/rank<k>.log).
bool run_ranks(const fs::path& dir, int64_t world, const std::string& port, const std::vector<std::string>& sets) {
  std::vector<pid_t> pids;
  for (int64_t r = 0; r < world; ++r) pids.push_back(spawn_rank(dir, r, world, port, sets));
  bool ok = true;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok)
    for (int64_t r = 0; r < world; ++r) MESSAGE("rank ", r, ":\n", slurp(dir / ("rank" + std::to_string(r) + ".log")));
  return ok;
}

std::vector<std::string> single(const std::vector<std::string>& sets, const std::vector<std::string>& more) {
  std::vector<std::string> out = sets;
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

struct ScopedEnv {
  std::vector<std::string> names;
  void set(const char* k, const char* v) {
    names.emplace_back(k);
    ::setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (const auto& n : names) ::unsetenv(n.c_str());
  }
};

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("distributed: torchrun's variables are read and checked by name") {
  {
    ScopedEnv env;  // unset: one process
    CHECK(ax::train::read_dist_env().world == 1);
    CHECK(!ax::train::read_dist_env().launched);
  }
  {
    ScopedEnv env;
    env.set("WORLD_SIZE", "4");
    env.set("RANK", "3");
    env.set("LOCAL_RANK", "1");
    env.set("MASTER_ADDR", "node0");
    env.set("MASTER_PORT", "29501");
    auto e = ax::train::read_dist_env();
    CHECK(e.world == 4);
    CHECK(e.rank == 3);
    CHECK(e.local_rank == 1);
    CHECK(e.master_addr == "node0");
    CHECK(e.master_port == 29501);
  }
  {
    ScopedEnv env;
    env.set("WORLD_SIZE", "2");
    env.set("RANK", "2");
    CHECK(usage_error([] { ax::train::read_dist_env(); }) == "environment: RANK=\"2\" is not an integer in [0, 1]");
  }
  {
    ScopedEnv env;
    env.set("WORLD_SIZE", "2x");
    CHECK(usage_error([] { ax::train::read_dist_env(); }) == "environment: WORLD_SIZE=\"2x\" is not an integer in [1, 1048576]");
  }
  {
    ScopedEnv env;
    env.set("WORLD_SIZE", "2");
    env.set("RANK", "0");
    CHECK(usage_error([] { ax::train::read_dist_env(); }) == "environment: WORLD_SIZE=2 but MASTER_ADDR is not set");
    env.set("MASTER_ADDR", "127.0.0.1");
    env.set("MASTER_PORT", "70000");
    CHECK(usage_error([] { ax::train::read_dist_env(); }) == "environment: MASTER_PORT=\"70000\" is not an integer in [1, 65535]");
  }
}

TEST_CASE("distributed: the [distributed] table is validated like the others") {
  auto dir = ax::test::scratch_dir("dist_config");
  auto error_of = [&](const std::string& table) {
    std::ofstream(dir / "run.toml") << "[distributed]\n" << table;
    try {
      auto cfg = ax::load_config(dir / "run.toml", {});
      ax::train::read_distributed_config(cfg);
    } catch (const std::runtime_error& e) {
      std::string m = e.what();
      auto at = m.find("run.toml");
      return at == std::string::npos ? m : m.substr(at);
    }
    return std::string();
  };
  CHECK(error_of("backend = \"gloo\"\nbucket_mb = 4\ntimeout_s = 30\n").empty());
  CHECK(error_of("backend = \"mpi\"\n").rfind("run.toml:2:11: 'distributed.backend' is \"mpi\", expected one of auto, nccl, gloo", 0) == 0);
  CHECK(error_of("bucket_mb = 0\n").rfind("run.toml:2:13: 'distributed.bucket_mb'", 0) == 0);
  CHECK(error_of("timeout_s = 0\n").rfind("run.toml:2:13: 'distributed.timeout_s'", 0) == 0);
  CHECK(error_of("shard_base = true\n").empty());  // dist_shard_base_test.cpp checks it further
  ax::test::remove_tree(dir);
}

namespace {

// setup_run trains micro_batch_size 2 on 80 one-digit sums; constant lr after warmup, so that a run cut short
// and resumed follows the same schedule as one run through. One intra-op thread: the same sums in every process.
// The CPU and Gloo on every machine: on a GPU machine "auto" would pick CUDA and NCCL, one GPU per rank.
const std::vector<std::string> kCommon{"train.schedule=constant", "train.log_every=1", "eval.every_steps=0",
                                       "eval.exact_match=false", "distributed.timeout_s=60", "train.cpu_threads=1",
                                       "device.type=cpu"};

// `axengine run` alone (no group) with kCommon and `more`; its log in dir/<out>.log.
int run_single(const fs::path& dir, const std::string& out, const std::vector<std::string>& more) {
  std::vector<std::string> args{"run", "--config", (dir / "run.toml").string()};
  for (const auto& s : single(kCommon, single({"run.output_dir=" + out}, more))) args.insert(args.end(), {"--set", s});
  int rc = ax::test::run(args, dir / (out + ".log"));
  if (rc != 0) MESSAGE(slurp(dir / (out + ".log")));
  return rc;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("distributed: 2 ranks started by axengine launch train what 1 process with grad_accum 2 trains") {
  auto dir = ax::test::setup_run("dist_launch2", "max_steps = 6\n");
  REQUIRE(run_single(dir, "one", {"train.grad_accum=2"}) == 0);
  std::vector<std::string> args{"launch", "--nproc", "2", "--", "run", "--config", (dir / "run.toml").string()};
  // 1 KiB buckets: several of them, started in one order on both ranks while backward runs.
  for (const auto& s : single(kCommon, {"run.output_dir=two", "distributed.bucket_mb=0.001"})) args.insert(args.end(), {"--set", s});
  int rc = ax::test::run(args, dir / "two.log");
  std::string log = slurp(dir / "two.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("[rank 0/2] ") != std::string::npos);  // the lines carry the rank
  CHECK(log.find("launch: all 2 ranks finished") != std::string::npos);
  CHECK(log.find("done: 6 steps") != std::string::npos);
  // Rank 1 says only warnings and errors: the info lines (the plan, the progress) come once, from rank 0.
  CHECK(log.find("[I] [rank 1/2] ") == std::string::npos);
  CHECK(log.find("[I] [rank 0/2] training: ") != std::string::npos);
  // The all-reduce overlapped with backward: buckets were started from the gradient hooks, before backward
  // returned (counted by the reducer, not timed), and there were several.
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex("gradient all-reduce: (\\d+) of (\\d+) buckets started during backward")));
  CHECK(std::stoi(m[1]) >= 1);
  CHECK(std::stoi(m[2]) > 1);
  check_same_losses(losses(dir / "two"), losses(dir / "one"));
  check_same_adapter(dir / "two", dir / "one", 6);
  ax::test::remove_tree(dir);
}

TEST_CASE("distributed: 3 ranks (torchrun's variables) resume a 1-process run at the same sample order") {
  // Reference: one process, grad_accum 3, 4 steps through. Then 2 steps alone and steps 3-4 on 3 ranks with
  // grad_accum 1: a step takes the same 6 rows (global micro-batch index), so the losses and the adapter agree.
  auto dir = ax::test::setup_run("dist_resume3", "max_steps = 4\n");
  REQUIRE(run_single(dir, "ref", {"train.grad_accum=3"}) == 0);
  REQUIRE(run_single(dir, "mixed", {"train.grad_accum=3", "train.max_steps=2"}) == 0);
  CHECK(losses(dir / "mixed").size() == 2);
  REQUIRE(run_ranks(dir, 3, port_for(2), single(kCommon, {"run.output_dir=mixed", "checkpoint.resume_from=latest"})));
  std::string log0 = slurp(dir / "rank0.log");
  CHECK(log0.find("resumed from ") != std::string::npos);
  check_same_losses(losses(dir / "mixed"), losses(dir / "ref"));
  check_same_adapter(dir / "mixed", dir / "ref", 4);
  // And back: 3 ranks for 2 steps, 1 process (grad_accum 3) for the rest.
  REQUIRE(run_ranks(dir, 3, port_for(3), single(kCommon, {"run.output_dir=back", "train.max_steps=2"})));
  REQUIRE(run_single(dir, "back", {"train.grad_accum=3", "checkpoint.resume_from=latest"}) == 0);
  check_same_losses(losses(dir / "back"), losses(dir / "ref"));
  check_same_adapter(dir / "back", dir / "ref", 4);
  ax::test::remove_tree(dir);
}

TEST_CASE("distributed: a rank that dies makes the others stop with a message, not hang") {
  // Rank 0 is SIGKILLed while writing the first checkpoint (only rank 0 writes, so only it reaches the crash
  // point); rank 1 waits for it at the barrier after the checkpoint and must notice on its own, well before
  // the launcher's grace period would SIGTERM it.
  auto dir = ax::test::setup_run("dist_dead", "max_steps = 4\n[checkpoint]\nevery_steps = 2\n");
  std::vector<std::string> args{"launch", "--nproc", "2", "--grace-s", "100", "--", "run", "--config", (dir / "run.toml").string()};
  for (const auto& s : kCommon) args.insert(args.end(), {"--set", s});
  const auto t0 = std::chrono::steady_clock::now();
  int rc = ax::test::run(args, dir / "dead.log", {{"AXENGINE_TEST_CRASH_AT", "checkpoint.dir_filled"}});
  const double took = seconds_since(t0);
  std::string log = slurp(dir / "dead.log");
  INFO(log);
  CHECK(rc == 128 + 9);  // the first failure's status: rank 0's SIGKILL
  CHECK(log.find("launch: rank 0 (pid ") != std::string::npos);
  CHECK(log.find(") was killed by signal 9") != std::string::npos);
  CHECK(log.find("distributed: rank 1 of 2 (gloo): barrier failed: ") != std::string::npos);
  CHECK(log.find("Another rank exited or stopped answering") != std::string::npos);
  CHECK(log.find("launch: rank 1 (pid ") != std::string::npos);  // it exited with an error of its own...
  CHECK(log.find("sending SIGTERM") == std::string::npos);       // ...not because the launcher stopped it
  CHECK(took < 90);
  ax::test::remove_tree(dir);
}

// c10d retries the connection once: the rendezvous fails after about twice timeout_s.
TEST_CASE("distributed: a rank whose peers never come fails the rendezvous in bounded time") {
  auto dir = ax::test::setup_run("dist_alone", "max_steps = 2\n");
  const auto t0 = std::chrono::steady_clock::now();
  pid_t p = spawn_rank(dir, 1, 2, port_for(4), single(kCommon, {"distributed.timeout_s=5"}));
  int status = 0;
  ::waitpid(p, &status, 0);
  const double took = seconds_since(t0);
  std::string log = slurp(dir / "rank1.log");
  INFO(log);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) != 0));
  CHECK(log.find("distributed: rank 1 of 2 could not join the process group at 127.0.0.1:") != std::string::npos);
  CHECK(took < 60);
  ax::test::remove_tree(dir);
}
