// Stopping a run (docs/training.md, "Stopping a run"): a stop signal at any phase of a step (delivered at a named
// point through AXENGINE_TEST_SIGNAL_AT, crash_point.hpp: no timing) makes the run finish the step, write its
// checkpoint and exit 128 + the signal; --resume then ends bitwise where the uninterrupted run does. A second
// signal stops at once. checkpoint.every_minutes saves on an injected clock. Distributed (Gloo, 2 ranks): one
// rank's signal stops both at the same step with one checkpoint, and a signal to `axengine launch` is passed on.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "unit/cli_util.hpp"
#include "unit/free_port.hpp"
#include "unit/run_compare.hpp"

namespace fs = std::filesystem;
using ax::test::EnvVars;
using ax::test::slurp;

namespace {

std::vector<std::string> run_args(const fs::path& dir, const std::string& out, bool resume, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> a{"run", "--config", (dir / "run.toml").string(), "--set", "run.output_dir=" + out, "--set", "data.cache=false"};
  for (const auto& s : sets) a.insert(a.end(), {"--set", s});
  if (resume) a.push_back("--resume");
  return a;
}

struct Case {
  std::string at;   // AXENGINE_TEST_SIGNAL_AT
  int sig;          // the signal it raises
  int stop_step;    // where the run must stop
};

}  // namespace

TEST_CASE("stop: a signal at each phase of a step stops the run after it with a checkpoint; --resume ends bitwise as the uninterrupted run") {
  // 6 steps, eval and a checkpoint at step 3 (and the end), every point of a step and of the eval and of that
  // checkpoint's writers.
  auto dir = ax::test::setup_run("stop_phases", std::string("max_steps = 6\n[eval]\nevery_steps = 3\n[checkpoint]\nevery_steps = 3\nkeep_last = 10\n") + ax::test::kOnCpu);
  REQUIRE(ax::test::run(run_args(dir, "ref", false), dir / "ref.log", {{"AXENGINE_TEST_CRASH_TRACE", (dir / "ref.trace").string()}}) == 0);
  const auto trace = ax::test::lines_of(dir / "ref.trace");
  for (const char* p : {"step.enqueued", "step.forward", "step.backward", "step.optimizer", "step.recorded", "step.boundary", "eval.loss"}) {
    CAPTURE(p);
    CHECK(std::count(trace.begin(), trace.end(), p) >= 2);  // the points this test uses are where it thinks
  }
  // A signal within step k stops at k; one at the boundary after step k (its last point) at k + 1; one while
  // the checkpoint of step 3 or the eval at 3 is written, at step 4 (the boundary's decision came before).
  const std::vector<Case> cases{
      {"step.forward@2:INT", SIGINT, 2},        {"step.backward@2", SIGTERM, 2},     {"step.optimizer@2:USR1", SIGUSR1, 2},
      {"step.enqueued@5", SIGTERM, 5},          {"step.recorded@1", SIGTERM, 1},     {"step.boundary@2", SIGTERM, 3},
      {"eval.loss@2", SIGTERM, 4},              {"checkpoint.file_opened@1", SIGTERM, 4},
      {"checkpoint.dir_renamed@1", SIGTERM, 4}, {"report.file_opened@1", SIGTERM, 4}};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    CAPTURE(c.at);
    const std::string out = "stop" + std::to_string(i);
    const fs::path log = dir / (out + ".log");
    const int rc = ax::test::run(run_args(dir, out, false), log, {{"AXENGINE_TEST_SIGNAL_AT", c.at}});
    std::string text = slurp(log);
    INFO(text);
    CHECK(rc == 128 + c.sig);
    CHECK(text.find("stopping after the current step with a checkpoint") != std::string::npos);
    const std::string want = "interrupted at step " + std::to_string(c.stop_step) + " by ";
    CHECK(text.find(want) != std::string::npos);
    CHECK(text.find("; resume with --resume") != std::string::npos);
    const auto steps = ax::test::checkpoint_steps(dir / out);
    REQUIRE(!steps.empty());
    CHECK(steps.back() == c.stop_step);
    // The checkpoint's metrics are whole: one record a step up to the stop.
    CHECK(ax::test::step_records(dir / out / "metrics.jsonl").size() == static_cast<std::size_t>(c.stop_step));
    REQUIRE(ax::test::run(run_args(dir, out, true), log) == 0);
    text = slurp(log);
    CHECK(text.find("resumed from ") != std::string::npos);
    ax::test::check_same_run(dir / out, dir / "ref", 6);
    ax::test::remove_tree(dir / out);
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("stop: a second signal stops at once, without a checkpoint") {
  auto dir = ax::test::setup_run("stop_twice", "max_steps = 4\n");
  // The first while step 2 runs; the second when the checkpoint that stop writes opens its first file.
  const int rc = ax::test::run(run_args(dir, "out", false), dir / "twice.log",
                               {{"AXENGINE_TEST_SIGNAL_AT", "step.forward@2:INT,checkpoint.file_opened@1:TERM"}});
  const std::string text = slurp(dir / "twice.log");
  INFO(text);
  CHECK(rc == 128 + SIGTERM);
  CHECK(text.find("second signal: stopping at once, without a checkpoint") != std::string::npos);
  CHECK(text.find("interrupted at step") == std::string::npos);
  CHECK(ax::test::checkpoint_steps(dir / "out").empty());  // the one being written never appeared
  // What it left (a temp directory, no lock holder) does not stand in the way of --resume, which starts over.
  REQUIRE(ax::test::run(run_args(dir, "out", true), dir / "again.log") == 0);
  CHECK(ax::test::checkpoint_steps(dir / "out") == std::vector<int>{4});
  ax::test::remove_tree(dir);
}

TEST_CASE("stop: checkpoint.every_minutes saves on the clock (injected: AXENGINE_TEST_CLOCK_STEP_S), reset by every save") {
  auto dir = ax::test::setup_run("stop_minutes", "max_steps = 7\n[checkpoint]\nkeep_last = 10\n");
  const EnvVars clock{{"AXENGINE_TEST_CLOCK_STEP_S", "25"}};  // 25 s a step: every_minutes = 1 is due after 3 steps
  REQUIRE(ax::test::run(run_args(dir, "a", false, {"checkpoint.every_minutes=1"}), dir / "a.log", clock) == 0);
  CHECK(ax::test::checkpoint_steps(dir / "a") == std::vector<int>{3, 6, 7});
  // Saves by every_steps restart the clock: with one every 2 steps, 60 s never pass.
  REQUIRE(ax::test::run(run_args(dir, "b", false, {"checkpoint.every_minutes=1", "checkpoint.every_steps=2"}), dir / "b.log", clock) == 0);
  CHECK(ax::test::checkpoint_steps(dir / "b") == std::vector<int>{2, 4, 6, 7});
  REQUIRE(ax::test::run(run_args(dir, "c", false, {"checkpoint.every_minutes=0"}), dir / "c.log", clock) == 0);
  CHECK(ax::test::checkpoint_steps(dir / "c") == std::vector<int>{7});
  // The default is 30 minutes: 10 minutes a step make it due every 3 steps. A negative value is refused, by
  // validate too.
  REQUIRE(ax::test::run(run_args(dir, "d", false), dir / "d.log", {{"AXENGINE_TEST_CLOCK_STEP_S", "600"}}) == 0);
  CHECK(ax::test::checkpoint_steps(dir / "d") == std::vector<int>{3, 6, 7});
  for (const char* command : {"validate", "run"}) {
    CAPTURE(command);
    CHECK(ax::test::run({command, "--config", (dir / "run.toml").string(), "--set", "run.output_dir=e", "--set", "checkpoint.every_minutes=-1"},
                        dir / "e.log") == 2);
    CHECK(slurp(dir / "e.log").find("'checkpoint.every_minutes' must be a number of minutes >= 0") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir / "e"));
  ax::test::remove_tree(dir);
}

namespace {

// `axengine run` as rank `rank` of 2, torchrun's variables set by hand; its log is dir/<tag>.rank<k>.log.
pid_t spawn_rank(const fs::path& dir, const std::string& tag, int rank, int port, const std::vector<std::string>& args, const EnvVars& extra) {
  EnvVars env{{"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"},
              {"MASTER_ADDR", "127.0.0.1"},   {"MASTER_PORT", std::to_string(port)}, {"AXENGINE_TEST_CLOCK_STEP_S", "25"}};
  env.insert(env.end(), extra.begin(), extra.end());
  return ax::test::spawn(args, dir / (tag + ".rank" + std::to_string(rank) + ".log"), env);
}

// Both ranks' exit codes (-1: killed).
std::vector<int> run_two(const fs::path& dir, const std::string& tag, const std::vector<std::string>& args, const EnvVars& rank1_env = {}) {
  const int port = ax::test::free_tcp_port();
  std::vector<pid_t> pids{spawn_rank(dir, tag, 0, port, args, {}), spawn_rank(dir, tag, 1, port, args, rank1_env)};
  std::vector<int> codes;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return codes;
}

}  // namespace

TEST_CASE("stop: 2 ranks (Gloo), one gets the signal: both stop at the same step with one checkpoint; --resume ends bitwise") {
  // Both multi-rank tests run on the CPU: their subject is signals between processes over Gloo, and two ranks
  // need two GPUs where the machine has any (LOCAL_RANK picks the device).
  auto dir = ax::test::setup_run("stop_dist", std::string("max_steps = 7\n[checkpoint]\nkeep_last = 10\nevery_minutes = 1\n") + ax::test::kOnCpu);
  const std::vector<std::string> dist{"distributed.backend=gloo"};
  REQUIRE(run_two(dir, "ref", run_args(dir, "ref", false, dist)) == std::vector<int>{0, 0});
  // The time-based save is rank 0's decision, made with step 4's all-reduce (due after 3 steps of 25 s): both
  // ranks take part in it. The last one is the end's.
  CHECK(ax::test::checkpoint_steps(dir / "ref") == std::vector<int>{4, 7});

  // Rank 1 alone gets SIGTERM during step 2's backward: its request rides step 3's all-reduce, and both ranks
  // stop after step 3, having written (rank 0) and waited for (rank 1) its checkpoint.
  const auto codes = run_two(dir, "stop", run_args(dir, "out", false, dist), {{"AXENGINE_TEST_SIGNAL_AT", "step.backward@2"}});
  const std::string log0 = slurp(dir / "stop.rank0.log"), log1 = slurp(dir / "stop.rank1.log");
  INFO(log0);
  INFO(log1);
  CHECK(codes == std::vector<int>{128 + SIGTERM, 128 + SIGTERM});
  CHECK(log0.find("interrupted at step 3 by SIGTERM; resume with --resume") != std::string::npos);
  CHECK(log1.find("interrupted at step 3 by SIGTERM; resume with --resume") != std::string::npos);
  CHECK(log0.find("stopping after the current step") == std::string::npos);  // rank 0 got no signal itself
  CHECK(ax::test::checkpoint_steps(dir / "out") == std::vector<int>{3});
  REQUIRE(run_two(dir, "resume", run_args(dir, "out", true, dist)) == std::vector<int>{0, 0});
  ax::test::check_same_run(dir / "out", dir / "ref", 7);
  ax::test::remove_tree(dir);
}

TEST_CASE("stop: a signal to axengine launch is passed to the ranks, which stop together with a checkpoint") {
  auto dir = ax::test::setup_run("stop_launch", std::string("max_steps = 6\n[checkpoint]\nevery_steps = 2\nkeep_last = 10\n") + ax::test::kOnCpu);
  std::vector<std::string> args{"launch", "--nproc", "2", "--"};
  for (const auto& a : run_args(dir, "out", false, {"distributed.backend=gloo"})) args.push_back(a);
  // Rank 0 (the only one writing checkpoints) holds at the end of step 2's checkpoint until the signal comes;
  // rank 1 waits for it at the barrier after the checkpoint.
  const fs::path log = dir / "launch.log";
  const pid_t launcher = ax::test::spawn(args, log, {{"AXENGINE_TEST_PAUSE_AT", "checkpoint.dir_parent_synced@1"}});
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  bool exited = false;  // a launcher that ended before the pause (a rank refused to start) fails at once
  while (slurp(log).find("AXENGINE_TEST_PAUSE_AT: paused at") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(300) &&
         !(exited = ::waitpid(launcher, &status, WNOHANG) == launcher))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  INFO(slurp(log));
  REQUIRE_FALSE(exited);
  REQUIRE(::kill(launcher, SIGTERM) == 0);
  ::waitpid(launcher, &status, 0);
  const std::string text = slurp(log);
  INFO(text);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM));
  CHECK(text.find("launch: got Terminated; passing it to the ranks") != std::string::npos);
  // The ranks asked at the boundary after step 3 (step 2's decision was taken before the signal came).
  CHECK(text.find("[rank 0/2] interrupted at step 3 by SIGTERM") != std::string::npos);
  CHECK(text.find("[rank 1/2] interrupted at step 3 by SIGTERM") != std::string::npos);
  CHECK(text.find("launch: rank 0 (pid ") != std::string::npos);
  CHECK(text.find(") stopped: it exited with code 143") != std::string::npos);
  CHECK(ax::test::checkpoint_steps(dir / "out") == std::vector<int>{2, 3});
  ax::test::remove_tree(dir);
}
