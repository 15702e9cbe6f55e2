// Durable small outputs (docs/training.md, "Durable outputs"): metrics.jsonl and the TensorBoard events are
// appended whole or not at all. A full disk — a real one (a 16 KiB tmpfs in a mount namespace of a child, where
// the machine lets the test mount one) and an injected one (AXENGINE_TEST_WRITE_FAIL_AT) — is said once and
// stops the run with a checkpoint, leaving no torn record; readers skip a torn last record anyway. The
// prepared-data cache is keyed by the data's bytes (an edit keeping size and mtime is not served stale), and a
// run refused at its first step leaves output_dir as it found it.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "axengine/crash_point.hpp"
#include "train/append_record.hpp"
#include "train/report.hpp"
#include "train/tensorboard.hpp"
#include "unit/cli_util.hpp"
#include "unit/run_compare.hpp"

namespace fs = std::filesystem;
using ax::test::slurp;

namespace {

constexpr int kSkip = 77;

// Runs `body` in a forked child inside a mount namespace of its own with a tmpfs of `size` mounted on `mnt`
// (empty, created); then copies what is there to <mnt>.copy, for the parent (which does not see the mount).
// The child's exit code; kSkip when this machine does not let it mount one (not root, no namespaces).
int on_small_tmpfs(const fs::path& mnt, const char* size, const std::function<int()>& body) {
  fs::create_directories(mnt);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, (std::string("size=") + size).c_str()) != 0)
      ::_exit(kSkip);
    int rc = body();
    std::error_code ec;
    fs::copy(mnt, mnt.string() + ".copy", fs::copy_options::recursive, ec);
    ::_exit(ec ? 3 : rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The TFRecords of an event file, each checked (lengths, CRCs); REQUIREs that the file ends at a record's end.
std::size_t whole_tfrecords(const fs::path& file) {
  const std::string b = slurp(file);
  std::size_t at = 0, n = 0;
  auto u64 = [&](std::size_t i) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b[i + k]);
    return v;
  };
  auto u32 = [&](std::size_t i) { return static_cast<uint32_t>(u64(i) & 0xffffffffu); };
  while (at < b.size()) {
    REQUIRE(at + 12 <= b.size());
    const uint64_t len = u64(at);
    REQUIRE(u32(at + 8) == ax::train::masked_crc32c(std::string_view(b).substr(at, 8)));
    REQUIRE(at + 12 + len + 4 <= b.size());
    REQUIRE(u32(at + 12 + len) == ax::train::masked_crc32c(std::string_view(b).substr(at + 12, len)));
    at += 12 + len + 4;
    ++n;
  }
  return n;
}

nlohmann::json step_record(int step) {
  return {{"step", step}, {"epoch", 0.25 * step}, {"loss", 2.5 - 0.01 * step}, {"lr", 3e-3}, {"grad_norm", 1.25},
          {"tokens", 640}, {"tokens_per_s", 12345.5}, {"time", 1.7e9 + step}};
}

}  // namespace

TEST_CASE("durable outputs: a failed append (injected) leaves the file as it was and says why") {
  auto dir = ax::test::scratch_dir("append_fault");
  const std::string f = (dir / "log.jsonl").string();
  ax::set_test_hook_for_test("AXENGINE_TEST_WRITE_FAIL_AT", "unit.append@2");
  ax::train::append_record(f, "one\n", "unit");
  try {
    ax::train::append_record(f, "two two two\n", "unit");
    FAIL("no error");
  } catch (const ax::train::WriteError& e) {
    CHECK(std::string(e.what()) == f + ": write failed after 6 of 12 bytes: No space left on device; the partial record was removed");
  }
  ax::train::append_record(f, "three\n", "unit");
  ax::set_test_hook_for_test("AXENGINE_TEST_WRITE_FAIL_AT", "");
  CHECK(slurp(f) == "one\nthree\n");
  ax::test::remove_tree(dir);
}

TEST_CASE("durable outputs: on a full tmpfs, metrics.jsonl and the TensorBoard events end with a whole record") {
  auto dir = ax::test::scratch_dir("append_tmpfs");
  const fs::path mnt = dir / "small";
  // Appends until the disk is full (16 KiB: tens of records, the last one cut by the kernel mid-way).
  const int rc = on_small_tmpfs(mnt, "16k", [&]() -> int {
    ax::train::MetricsLog metrics;
    int written = 0;
    try {
      for (int s = 1; s < 10000; ++s, ++written) metrics.append(mnt.string(), step_record(s));
      return 10;  // never full
    } catch (const ax::train::WriteError& e) {
      std::ofstream(dir / "metrics.error") << e.what();
    }
    std::ofstream(dir / "metrics.count") << written;
    ::unlink((mnt / "metrics.jsonl").c_str());  // room for the events
    try {
      ax::train::TensorBoardLog tb(mnt.string(), {}, true);
      for (int s = 1; s < 100000; ++s) tb.append(step_record(s));
      return 11;
    } catch (const ax::train::WriteError& e) {
      std::ofstream(dir / "events.error") << e.what();
    }
    return 0;
  });
  if (rc == kSkip) {
    MESSAGE("skipped: cannot mount a tmpfs in a mount namespace here (needs root or user namespaces)");
    ax::test::remove_tree(dir);
    return;
  }
  REQUIRE(rc == 0);
  CHECK(slurp(dir / "metrics.error").find("metrics.jsonl: write failed after ") != std::string::npos);
  CHECK(slurp(dir / "metrics.error").find("No space left on device; the partial record was removed") != std::string::npos);
  CHECK(slurp(dir / "events.error").find("No space left on device; the partial record was removed") != std::string::npos);
  const int written = std::stoi(slurp(dir / "metrics.count"));
  CHECK(written > 10);
  // The copy of the events file (whatever its name): every record whole, as many as fit.
  std::size_t events = 0;
  for (const auto& e : fs::directory_iterator(mnt.string() + ".copy"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = whole_tfrecords(e.path());
  CHECK(events > 10);
  ax::test::remove_tree(dir);
}

TEST_CASE("durable outputs: a run whose disk fills up stops with an error and leaves whole records (real ENOSPC, tmpfs)") {
  // 40 steps log ~25 KiB of records and events into a 16 KiB output_dir: they fill it before the end, the run
  // says so and tries to save (which a full disk refuses too, naming the checkpoint): exit 1, nothing torn.
  auto dir = ax::test::setup_run("run_tmpfs", "max_steps = 40\n[checkpoint]\nevery_minutes = 0\n");
  const fs::path out = dir / "out";
  const std::vector<std::string> args{"run", "--config", (dir / "run.toml").string()};
  const int rc = on_small_tmpfs(out, "16k", [&] { return ax::test::run(args, dir / "run.log"); });
  if (rc == kSkip) {
    MESSAGE("skipped: cannot mount a tmpfs in a mount namespace here (needs root or user namespaces)");
    ax::test::remove_tree(dir);
    return;
  }
  const std::string log = slurp(dir / "run.log");
  INFO(log);
  CHECK(rc == 1);
  CHECK(log.find("write failed after ") != std::string::npos);
  CHECK(log.find("No space left on device; the partial record was removed: stopping the run with a checkpoint") != std::string::npos);
  const auto records = ax::test::run_records(out.string() + ".copy/metrics.jsonl");  // REQUIREs whole lines
  CHECK(!records.empty());
  CHECK(records.size() < 40);
  ax::test::remove_tree(dir);
}

TEST_CASE("durable outputs: a failed metrics or events write stops the run with a checkpoint; --resume ends bitwise") {
  auto dir = ax::test::setup_run("run_write_fail", std::string("max_steps = 5\n[checkpoint]\nkeep_last = 10\n") + ax::test::kOnCpu);
  auto args = [&](const std::string& out, bool resume) {
    std::vector<std::string> a{"run", "--config", (dir / "run.toml").string(), "--set", "run.output_dir=" + out};
    if (resume) a.push_back("--resume");
    return a;
  };
  REQUIRE(ax::test::run(args("ref", false), dir / "ref.log") == 0);
  // metrics.jsonl's 3rd append is step 3's record; the events' 1st is the file's header, the 3rd step 2's record.
  for (const auto& [at, step] : {std::pair<std::string, int>{"metrics.append@3", 3}, {"tensorboard.append@3", 2}}) {
    CAPTURE(at);
    const std::string out = "fail" + std::to_string(step);
    const int rc = ax::test::run(args(out, false), dir / (out + ".log"), {{"AXENGINE_TEST_WRITE_FAIL_AT", at}});
    const std::string log = slurp(dir / (out + ".log"));
    INFO(log);
    CHECK(rc == 1);
    CHECK(log.find(": write failed after ") != std::string::npos);
    CHECK(log.find("stopping the run with a checkpoint at the end of this step") != std::string::npos);
    CHECK(log.find("; stopped at step " + std::to_string(step) + " with checkpoint ") != std::string::npos);
    CHECK(log.find("continue with --resume") != std::string::npos);
    CHECK(ax::test::checkpoint_steps(dir / out) == std::vector<int>{step});
    CHECK(ax::test::run_records(dir / out / "metrics.jsonl").size() == static_cast<std::size_t>(step));  // rewritten whole
    for (const auto& e : fs::directory_iterator(dir / out))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) whole_tfrecords(e.path());
    REQUIRE(ax::test::run(args(out, true), dir / (out + ".log")) == 0);
    ax::test::check_same_run(dir / out, dir / "ref", 5);
  }
  ax::test::remove_tree(dir);
}

TEST_CASE("durable outputs: a torn last record of metrics.jsonl is skipped by the reader and by --resume") {
  auto dir = ax::test::setup_run("torn_metrics", "max_steps = 4\n[checkpoint]\nevery_steps = 2\n");
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(ax::test::run({"run", "--config", cfg, "--set", "train.max_steps=2"}, dir / "a.log") == 0);
  // What a kill mid-append leaves: the start of a record, no newline.
  { std::ofstream(dir / "out" / "metrics.jsonl", std::ios::app) << R"({"step": 3, "epoch": 0.1, "lo)"; }
  ax::train::MetricsLog m;
  m.load((dir / "out").string(), 100);
  CHECK(m.records.size() == 3);  // two steps and the eval at the end; not the torn one
  CHECK(ax::train::render_report_html(m, "t", {}).find("<svg") != std::string::npos);
  REQUIRE(ax::test::run({"run", "--config", cfg, "--resume"}, dir / "b.log") == 0);
  CHECK(ax::test::step_records(dir / "out" / "metrics.jsonl").size() == 4);  // parses every line: none torn
  ax::test::remove_tree(dir);
}

TEST_CASE("prepared-data cache: an edit that keeps the file's size and mtime is not served from the cache") {
  auto dir = ax::test::setup_run("cache_edit", "max_steps = 1\n");
  const std::vector<std::string> args{"prepare", "--config", (dir / "run.toml").string()};
  REQUIRE(ax::test::run(args, dir / "a.log") == 0);
  CHECK(slurp(dir / "a.log").find("80 train / 20 eval samples (tokenised)") != std::string::npos);
  REQUIRE(ax::test::run(args, dir / "b.log") == 0);
  CHECK(slurp(dir / "b.log").find("80 train / 20 eval samples (prepared cache)") != std::string::npos);
  // One answer digit changed in place: same size; then the old mtime put back.
  const fs::path data = dir / "data" / "train.jsonl";
  struct stat before {};
  REQUIRE(::stat(data.c_str(), &before) == 0);
  std::string text = slurp(data);
  const auto at = text.find("\"answer\": \"");
  REQUIRE(at != std::string::npos);
  char& digit = text[at + 11];
  digit = digit == '7' ? '8' : '7';
  { std::ofstream(data, std::ios::binary | std::ios::trunc) << text; }
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  REQUIRE(::utimensat(AT_FDCWD, data.c_str(), times, 0) == 0);
  struct stat after {};
  REQUIRE(::stat(data.c_str(), &after) == 0);
  REQUIRE(after.st_size == before.st_size);
  REQUIRE(after.st_mtim.tv_sec == before.st_mtim.tv_sec);
  REQUIRE(after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
  REQUIRE(ax::test::run(args, dir / "c.log") == 0);
  CHECK(slurp(dir / "c.log").find("80 train / 20 eval samples (tokenised)") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("output_dir: a run stopped at its first forward pass (kernels.strict) leaves it as it found it; the corrected rerun runs") {
  // swiglu is asked for at the first forward only; fused_attn's backend needs a GPU, so kernels.strict refuses it
  // there on this CPU run (when the plan's checks learn to refuse it before, the run stops earlier: the same).
  fs::path plugin;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(AXENGINE_BIN_DIR) / "plugins", ec))
    if (e.path().filename().string().find("fused_attn") != std::string::npos && e.path().extension() == ".so") plugin = e.path();
  auto dir = ax::test::setup_run("strict_first_step", std::string("max_steps = 2\n[eval]\nevery_steps = 1\n") + ax::test::kOnCpu);
  const std::string cfg = (dir / "run.toml").string();
  if (plugin.empty()) {
    MESSAGE("skipped: the fused_attn plugin was not built");
    ax::test::remove_tree(dir);
    return;
  }
  const int rc = ax::test::run({"run", "--config", cfg, "--set", "kernels.strict=true", "--set", "kernels.swiglu=[\"fused_attn\"]"},
                               dir / "strict.log");
  const std::string log = slurp(dir / "strict.log");
  INFO(log);
  CHECK(rc == 2);
  CHECK(log.find("kernels.strict: no backend for swiglu") != std::string::npos);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir / "out", ec)) left.push_back(e.path().filename().string());
  CHECK(left.empty());  // no events file, no metrics.jsonl (the eval at step 0 waited in memory), no lock file
  REQUIRE(ax::test::run({"run", "--config", cfg}, dir / "rerun.log") == 0);
  CHECK(ax::test::step_records(dir / "out" / "metrics.jsonl").size() == 2);
  ax::test::remove_tree(dir);
}
