// Crash safety without timing: the axengine binary is killed (SIGKILL, through AXENGINE_TEST_CRASH_AT) at every
// crash point its atomic writers pass, as enumerated by AXENGINE_TEST_CRASH_TRACE on an uninterrupted run, and
// what it leaves must be usable:
//  - training (checkpoint, adapter and report writers): the checkpoint `--resume` picks loads, and the resumed
//    run ends with bitwise the same losses, adapter and trainer state as the uninterrupted run;
//  - init-model, merge-lora, prepare (the prepared-data cache): the destination is absent or complete, never
//    half-written, and a rerun writes the same bytes.
// The random-kill soak this replaces is bench/crash_soak.sh.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "axengine/builtins.hpp"
#include "axengine/models.hpp"
#include "axengine/selection.hpp"
#include "train/checkpoint.hpp"
#include "unit/cli_util.hpp"

namespace fs = std::filesystem;
using ax::test::EnvVars;

namespace {

struct Arrival {
  std::string point;
  int k;  // the k-th arrival at `point`
};

// Points in the order first reached, with their arrival counts.
std::vector<std::pair<std::string, int>> count_points(const std::vector<std::string>& trace) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& p : trace) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == p; });
    if (it == out.end()) out.emplace_back(p, 1);
    else ++it->second;
  }
  return out;
}

std::string writer_of(const std::string& point) { return point.substr(0, point.find('.')); }

// Runs `args` with the crash armed at `a`; checks the process died by SIGKILL there: the trace's last line is the
// point, reached for the k-th time.
void crash_at(const Arrival& a, const std::vector<std::string>& args, const fs::path& log, const fs::path& trace) {
  fs::remove(trace);
  int status = ax::test::run_status(
      args, log, {{"AXENGINE_TEST_CRASH_AT", a.point + "@" + std::to_string(a.k)}, {"AXENGINE_TEST_CRASH_TRACE", trace.string()}});
  INFO(ax::test::slurp(log));
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  auto seen = ax::test::lines_of(trace);
  REQUIRE(!seen.empty());
  CHECK(seen.back() == a.point);
  CHECK(std::count(seen.begin(), seen.end(), a.point) == a.k);
}

// Every point of a trace at its first arrival and, when it has more, at its last.
std::vector<Arrival> first_and_last(const std::vector<std::string>& trace) {
  std::vector<Arrival> out;
  for (const auto& [p, n] : count_points(trace)) {
    out.push_back({p, 1});
    if (n > 1) out.push_back({p, n});
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("crash points: a run killed at each point of the checkpoint, adapter and report writers resumes bitwise") {
  auto t0 = std::chrono::steady_clock::now();
  const int kSteps = 4;
  // A checkpoint every step, two kept: saves 3 and 4 prune; eval at step 2 and at the end.
  auto dir = ax::test::setup_run("crash_run", "max_steps = " + std::to_string(kSteps) +
                                                  "\n[eval]\nevery_steps = 2\n[checkpoint]\nevery_steps = 1\nkeep_last = 2\n");
  const std::string cfg = (dir / "run.toml").string();
  // The prepared-data cache has its own test below; here every run tokenises.
  auto args = [&](const std::string& out, bool resume) {
    std::vector<std::string> a{"run", "--config", cfg, "--set", "run.output_dir=" + out, "--set", "data.cache=false"};
    if (resume) a.push_back("--resume");
    return a;
  };
  REQUIRE(ax::test::run(args("ref", false), dir / "ref.log", {{"AXENGINE_TEST_CRASH_TRACE", (dir / "ref.trace").string()}}) == 0);
  auto trace = ax::test::lines_of(dir / "ref.trace");
  // The phases of a step and of an eval are points too (stop_cli_test.cpp raises signals there); a kill there
  // is a kill between two checkpoints, which the writers' points below cover.
  trace.erase(std::remove_if(trace.begin(), trace.end(), [](const std::string& p) { return writer_of(p) == "step" || writer_of(p) == "eval"; }),
              trace.end());
  const auto points = count_points(trace);
  std::set<std::string> writers;
  for (const auto& [p, n] : points) writers.insert(writer_of(p));
  CHECK(writers == std::set<std::string>{"adapter", "checkpoint", "report"});
  std::map<std::string, int> arrivals(points.begin(), points.end());
  // What the run must pass: each file step of each writer, each directory step, pruning.
  for (const char* step : {"file_opened", "file_half_written", "file_written", "file_synced", "file_renamed", "file_dir_synced"}) {
    CHECK(arrivals[std::string("checkpoint.") + step] == 3 * kSteps);  // trainer_state.{safetensors,json}, manifest
    // adapter_model.safetensors, adapter_config.json, axengine_training.json (the record merge-lora reads)
    CHECK(arrivals[std::string("adapter.") + step] == 3 * kSteps);
    CHECK(arrivals[std::string("report.") + step] == 2 * kSteps);      // metrics.jsonl, report.html
  }
  for (const char* step : {"dir_filled", "dir_synced", "dir_renamed", "dir_parent_synced"})
    CHECK(arrivals[std::string("checkpoint.") + step] == kSteps);
  CHECK(arrivals["checkpoint.prune_renamed"] == kSteps - 2);
  CHECK(arrivals["checkpoint.prune_removed"] == kSteps - 2);

  // Every point at its first arrival; the checkpoint's and the adapter's also at their last (the final save,
  // which a resumed run redoes over the checkpoint it left).
  std::vector<Arrival> plan;
  for (const auto& [p, n] : points) {
    plan.push_back({p, 1});
    if (n > 1 && writer_of(p) != "report") plan.push_back({p, n});
  }
  auto ref_records = ax::test::step_records(dir / "ref" / "metrics.jsonl");
  REQUIRE(ref_records.size() == static_cast<std::size_t>(kSteps));
  char last[32];
  std::snprintf(last, sizeof last, "step-%08d", kSteps);
  const fs::path ref_last = dir / "ref" / "checkpoints" / last;
  const std::string ref_adapter = ax::test::slurp(ref_last / "adapter_model.safetensors");
  const std::string ref_state = ax::test::slurp(ref_last / "trainer_state.safetensors");
  REQUIRE(!ref_adapter.empty());

  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Arrival& a = plan[i];
    CAPTURE(a.point);
    CAPTURE(a.k);
    const std::string out = "crash" + std::to_string(i);
    const fs::path log = dir / (out + ".log");
    crash_at(a, args(out, false), log, dir / (out + ".trace"));
    // Nothing half-written is ever picked: no checkpoint needs skipping, and the newest loads.
    auto latest = ax::train::load_latest_checkpoint((dir / out).string());
    CHECK(latest.skipped.empty());
    std::string resumed_from = latest.loaded ? latest.loaded->dir : "";
    REQUIRE(ax::test::run(args(out, true), log) == 0);
    std::string text = ax::test::slurp(log);
    INFO(text);
    if (!resumed_from.empty()) CHECK(text.find("resumed from " + resumed_from) != std::string::npos);
    auto got = ax::test::step_records(dir / out / "metrics.jsonl");
    REQUIRE(got.size() == ref_records.size());
    for (std::size_t s = 0; s < got.size(); ++s) CHECK(got[s]["loss"].get<double>() == ref_records[s]["loss"].get<double>());
    const fs::path got_last = dir / out / "checkpoints" / last;
    CHECK(ax::test::slurp(got_last / "adapter_model.safetensors") == ref_adapter);  // bitwise
    CHECK(ax::test::slurp(got_last / "trainer_state.safetensors") == ref_state);
    ax::test::remove_tree(dir / out);
  }
  MESSAGE(plan.size(), " crash points walked (", points.size(), " distinct) in ", seconds_since(t0), " s");
  ax::test::remove_tree(dir);
}

namespace {

// Walks the crash points of `writer` (first_and_last) for a command writing the directory `dest`
// (which must not exist beforehand): after each crash, `dest` is absent or complete (the reference's bytes; a
// rerun is then refused, the directory being non-empty), else a rerun writes it with the reference's bytes.
void walk_directory_writer(const fs::path& dir, const std::string& writer, const std::vector<std::string>& args,
                           const fs::path& dest) {
  fs::remove(dir / "ref.trace");
  REQUIRE(ax::test::run(args, dir / "ref.log", {{"AXENGINE_TEST_CRASH_TRACE", (dir / "ref.trace").string()}}) == 0);
  const auto ref = ax::test::tree_bytes(dest);
  REQUIRE(!ref.empty());
  auto trace = ax::test::lines_of(dir / "ref.trace");
  trace.erase(std::remove_if(trace.begin(), trace.end(), [&](const std::string& p) { return writer_of(p) != writer; }), trace.end());
  std::set<std::string> steps;
  for (const auto& p : trace) steps.insert(p.substr(writer.size() + 1));
  CHECK(steps == std::set<std::string>{"file_opened", "file_half_written", "file_written", "file_synced", "file_renamed",
                                       "file_dir_synced", "dir_filled", "dir_synced", "dir_renamed", "dir_parent_synced"});
  for (const auto& a : first_and_last(trace)) {
    CAPTURE(a.point);
    CAPTURE(a.k);
    ax::test::remove_tree(dest);
    crash_at(a, args, dir / "crash.log", dir / "crash.trace");
    if (fs::exists(dest)) {
      CHECK(ax::test::tree_bytes(dest) == ref);  // complete, never half-written
      CHECK(ax::test::run(args, dir / "rerun.log") == 2);
      CHECK(ax::test::slurp(dir / "rerun.log").find("not empty") != std::string::npos);
    } else {
      REQUIRE(ax::test::run(args, dir / "rerun.log") == 0);
    }
    CHECK(ax::test::tree_bytes(dest) == ref);
    CHECK_FALSE(fs::exists(dest.parent_path() / (".tmp-" + dest.filename().string())));  // the rerun's leftovers cleaned
  }
}

}  // namespace

TEST_CASE("crash points: init-model and merge-lora killed at each point leave no half-written model dir") {
  auto dir = ax::test::scratch_dir("crash_models");
  walk_directory_writer(dir, "init_model", {"init-model", "--preset", "tiny-llama", "--out", (dir / "model").string(), "--seed", "5"},
                        dir / "model");
  // An adapter with non-zero B (a fresh one would merge to the base weights).
  {
    ax::Registry reg;
    ax::register_builtins(reg);
    ax::ModelLoadOptions o;
    o.dir = (dir / "model").string();
    o.dtype = "fp32";
    o.lora = ax::LoraSpec{};
    o.lora->targets = {"q_proj", "v_proj", "down_proj"};
    o.kernels = std::make_shared<ax::KernelSet>(reg, ax::KernelPreferences{}, ax::DeviceInfo{});
    auto m = ax::load_model(reg, o);
    at::NoGradGuard no_grad;
    for (auto& [n, t] : m->trainable_parameters())
      if (n.find("lora_B") != std::string::npos) t.normal_(0, 0.1);
    m->save_adapter((dir / "adapter").string());
  }
  walk_directory_writer(dir, "merged_model",
                        {"merge-lora", "--model", (dir / "model").string(), "--adapter", (dir / "adapter").string(), "--out",
                         (dir / "merged").string()},
                        dir / "merged");
  ax::test::remove_tree(dir);
}

TEST_CASE("crash points: prepare killed at each point of the prepared-data cache leaves each cache file absent or whole") {
  auto dir = ax::test::setup_run("crash_prepare", "");
  const std::vector<std::string> args{"prepare", "--config", (dir / "run.toml").string()};
  REQUIRE(ax::test::run(args, dir / "ref.log", {{"AXENGINE_TEST_CRASH_TRACE", (dir / "ref.trace").string()}}) == 0);
  // The cache files (train and eval), without temp files a killed writer leaves (hidden, never read).
  auto cache = [&] {
    auto all = ax::test::tree_bytes(dir / "cache");
    for (auto it = all.begin(); it != all.end();) it = it->first.front() == '.' ? all.erase(it) : std::next(it);
    return all;
  };
  const auto ref = cache();
  REQUIRE(ref.size() == 2);
  const auto trace = ax::test::lines_of(dir / "ref.trace");
  for (const auto& p : trace) CHECK(writer_of(p) == "data_cache");
  CHECK(count_points(trace).size() == 6);
  for (const auto& a : first_and_last(trace)) {  // two cache files: every arrival
    CAPTURE(a.point);
    CAPTURE(a.k);
    ax::test::remove_tree(dir / "cache");
    crash_at(a, args, dir / "crash.log", dir / "crash.trace");
    for (const auto& [name, bytes] : cache()) {
      CAPTURE(name);
      REQUIRE(ref.count(name) == 1);
      CHECK(bytes == ref.at(name));  // whole, never half-written
    }
    REQUIRE(ax::test::run(args, dir / "rerun.log") == 0);
    CHECK(cache() == ref);
  }
  ax::test::remove_tree(dir);
}
