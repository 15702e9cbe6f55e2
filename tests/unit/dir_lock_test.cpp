// One writer per directory (axengine/dir_lock.hpp): a second process is refused naming the holder's pid and
// host; a lock whose holder died is taken over, with a line saying so; `run` (also with --resume or
// --overwrite), `prepare` and `merge-lora` take theirs before writing anything. Deterministic: the first
// process is held at a point (AXENGINE_TEST_PAUSE_AT) or the test holds the lock itself.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "axengine/dir_lock.hpp"
#include "axengine/error.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof h - 1);
  return h;
}

// The message a forked child gets when it tries the lock ("" when it got it).
std::string try_in_child(const std::string& file, const std::string& what) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    try {
      ax::DirLock lock(file, what);
    } catch (const ax::UsageError& e) {
      msg = e.what();
    }
    ssize_t w = ::write(fds[1], msg.data(), msg.size());
    ::_exit(w == static_cast<ssize_t>(msg.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return msg;
}

}  // namespace

TEST_CASE("dir lock: a second holder is refused naming the first; released, the file is gone; a dead holder's is taken over") {
  auto dir = ax::test::scratch_dir("dir_lock");
  const std::string file = (dir / "out" / ax::kDirLockFile).string();
  {
    ax::DirLock lock(file, "run.output_dir out");  // creates out/
    CHECK(slurp(file) == "pid " + std::to_string(::getpid()) + "\nhost " + host_name() + "\n");
    CHECK(try_in_child(file, "run.output_dir out") ==
          "run.output_dir out is in use by pid " + std::to_string(::getpid()) + " (host " + host_name() + "): one writer at a time (lock file " +
              file + ")");
  }
  CHECK_FALSE(fs::exists(file));
  CHECK(try_in_child(file, "x").empty());  // free again
  // A file left by a holder that died (its lock went with it): taken over, the file now names this process.
  std::ofstream(file) << "pid 999999\nhost elsewhere\n";
  {
    ax::DirLock lock(file, "run.output_dir out");
    CHECK(slurp(file) == "pid " + std::to_string(::getpid()) + "\nhost " + host_name() + "\n");
  }
  CHECK(ax::lock_file_beside((dir / "merged").string()) == (dir / ".merged.lock").string());
  CHECK(ax::lock_file_beside((dir / "merged/").string()) == (dir / ".merged.lock").string());
  ax::test::remove_tree(dir);
}

TEST_CASE("dir lock: a run, --resume or --overwrite into an output_dir in use is refused (exit 2); after a kill the lock is taken over") {
  auto dir = ax::test::setup_run("dir_lock_run", "max_steps = 3\n[checkpoint]\nevery_steps = 1\n");
  const std::string cfg = (dir / "run.toml").string();
  // The first run holds at the end of its first step, lock taken, a checkpoint written.
  const fs::path first_log = dir / "first.log";
  const pid_t first = ax::test::spawn({"run", "--config", cfg}, first_log, {{"AXENGINE_TEST_PAUSE_AT", "checkpoint.dir_parent_synced@1"}});
  const auto t0 = std::chrono::steady_clock::now();
  while (slurp(first_log).find("AXENGINE_TEST_PAUSE_AT: paused at") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(300))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(slurp(first_log).find("AXENGINE_TEST_PAUSE_AT: paused at") != std::string::npos);
  const std::string in_use = "run.output_dir " + (dir / "out").string() + " is in use by pid " + std::to_string(first) + " (host " + host_name() + ")";
  for (const char* flag : {"--resume", "--overwrite"}) {
    CAPTURE(flag);
    CHECK(ax::test::run({"run", "--config", cfg, flag}, dir / "second.log") == 2);
    const std::string log = slurp(dir / "second.log");
    INFO(log);
    CHECK(log.find(in_use) != std::string::npos);
    CHECK(log.find("--overwrite: removing") == std::string::npos);  // refused before touching anything
  }
  CHECK(ax::test::step_records(dir / "out" / "metrics.jsonl").size() == 1);  // the first run's, intact
  // The first dies holding it; the next run takes the lock over and says whose it was.
  REQUIRE(::kill(first, SIGKILL) == 0);
  int status = 0;
  ::waitpid(first, &status, 0);
  REQUIRE(ax::test::run({"run", "--config", cfg, "--resume"}, dir / "third.log") == 0);
  const std::string log = slurp(dir / "third.log");
  INFO(log);
  CHECK(log.find("run.output_dir " + (dir / "out").string() + ": taking over the lock left by pid " + std::to_string(first)) != std::string::npos);
  CHECK(log.find("resumed from ") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "out" / ax::kDirLockFile));  // released at the end
  ax::test::remove_tree(dir);
}

TEST_CASE("dir lock: prepare's cache_dir and merge-lora's output, held by another process, are refused naming it") {
  auto dir = ax::test::setup_run("dir_lock_tools", "max_steps = 1\n");
  const std::string mine = "pid " + std::to_string(::getpid()) + " (host " + host_name() + ")";
  {
    ax::DirLock held((dir / "cache" / ax::kDirLockFile).string(), "test");
    CHECK(ax::test::run({"prepare", "--config", (dir / "run.toml").string()}, dir / "prepare.log") == 2);
    CHECK(slurp(dir / "prepare.log").find("data.cache_dir " + (dir / "cache").string() + " is in use by " + mine) != std::string::npos);
  }
  REQUIRE(ax::test::run({"prepare", "--config", (dir / "run.toml").string()}, dir / "prepare.log") == 0);
  CHECK_FALSE(fs::exists(dir / "cache" / ax::kDirLockFile));
  REQUIRE(ax::test::run({"run", "--config", (dir / "run.toml").string()}, dir / "run.log") == 0);
  const std::vector<std::string> merge{"merge-lora", "--model", (dir / "model").string(), "--adapter",
                                       (dir / "out/checkpoints/step-00000001").string(), "--out", (dir / "merged").string()};
  {
    ax::DirLock held(ax::lock_file_beside((dir / "merged").string()), "test");
    CHECK(ax::test::run(merge, dir / "merge.log") == 2);
    CHECK(slurp(dir / "merge.log").find("merge-lora --out " + (dir / "merged").string() + " is in use by " + mine) != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "merged"));
  }
  REQUIRE(ax::test::run(merge, dir / "merge.log") == 0);
  CHECK(fs::exists(dir / "merged" / "config.json"));
  CHECK_FALSE(fs::exists(ax::lock_file_beside((dir / "merged").string())));
  ax::test::remove_tree(dir);
}
