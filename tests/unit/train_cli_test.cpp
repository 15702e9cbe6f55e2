// `axengine make-data / prepare / run` end to end on a tiny Llama, and the crash test: a run killed
// (SIGKILL) at random moments, checkpointing every step, always leaves a newest checkpoint that loads, and
// resuming it repeatedly ends bit-identical to an uninterrupted run.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "axengine/safetensors.hpp"
#include "train/checkpoint.hpp"
#include "unit/test_paths.hpp"
#include "unit/tiny_model.hpp"

namespace fs = std::filesystem;

namespace {

// Starts the axengine binary with `args`, stdout+stderr to `log`.
pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  std::string bin = std::string(AXENGINE_BIN_DIR) + "/axengine";
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::setenv("OMP_NUM_THREADS", "1", 1);  // the same threads in every process: bitwise comparisons
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

int run(const std::vector<std::string>& args, const fs::path& log) {
  int status = 0;
  ::waitpid(spawn(args, log), &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> step_records(const fs::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j);
  }
  return out;
}

fs::path setup_run(const std::string& name, const std::string& train_extra) {
  auto dir = ax::test::scratch_dir(name);
  ax::test::make_tiny_llama(dir / "model");
  std::ofstream(dir / "run.toml")
      << "[run]\noutput_dir = \"out\"\nseed = 11\n[model]\npath = \"model\"\n"
      << "[data]\nsequence_len = 64\ncache_dir = \"cache\"\n"
      << "[[datasets]]\ntype = \"completion\"\npath = \"data/train.jsonl\"\neval_path = \"data/eval.jsonl\"\n"
      << "prompt_field = \"prompt\"\ntext_field = \"answer\"\n"
      << "[lora]\nr = 8\nalpha = 16\n[train]\nlr = 3e-3\nwarmup_steps = 2\nmicro_batch_size = 2\nlog_every = 5\n" << train_extra;
  REQUIRE(run({"make-data", "--task", "arithmetic", "--out", (dir / "data").string(), "--train", "80", "--eval", "20", "--digits", "1"},
              dir / "make-data.log") == 0);
  return dir;
}

}  // namespace

TEST_CASE("cli: make-data, prepare and run train a tiny llama end to end") {
  auto dir = setup_run("cli_run", "max_steps = 12\n[eval]\nevery_steps = 6\n[checkpoint]\nevery_steps = 6\n");
  CHECK(run({"prepare", "--config", (dir / "run.toml").string()}, dir / "prepare.log") == 0);
  CHECK(slurp(dir / "prepare.log").find("80 train / 20 eval samples (tokenised)") != std::string::npos);
  int rc = run({"run", "--config", (dir / "run.toml").string()}, dir / "run.log");
  std::string log = slurp(dir / "run.log");
  INFO(log);
  REQUIRE(rc == 0);
  CHECK(log.find("(prepared cache)") != std::string::npos);  // prepare's work reused
  CHECK(log.find("kernel backends for ") != std::string::npos);  // cpu here, sm_XX on a GPU machine
  CHECK(log.find("exact match") != std::string::npos);
  CHECK(log.find("peak memory") != std::string::npos);
  auto steps = step_records(dir / "out" / "metrics.jsonl");
  REQUIRE(steps.size() == 12);
  CHECK(steps.back()["loss"].get<double>() < steps.front()["loss"].get<double>());
  auto ck = dir / "out" / "checkpoints" / "step-00000012";
  CHECK(fs::is_regular_file(ck / "adapter_config.json"));
  CHECK_NOTHROW(ax::safetensors::File::open((ck / "adapter_model.safetensors").string()));
  CHECK(slurp(dir / "out" / "report.html").find("<svg") != std::string::npos);
  ax::test::remove_tree(dir);
}

TEST_CASE("cli: killing a run at random moments never leaves a checkpoint that loads wrong; resume is bit-exact") {
  const int kSteps = 120;
  auto dir = setup_run("cli_kill", "max_steps = " + std::to_string(kSteps) + "\n[checkpoint]\nevery_steps = 1\nkeep_last = 2\n");
  const std::string cfg = (dir / "run.toml").string();
  REQUIRE(run({"run", "--config", cfg, "--set", "run.output_dir=ref"}, dir / "ref.log") == 0);

  std::mt19937 rng(20261121);
  std::uniform_int_distribution<int> delay_ms(400, 1600);
  int kills = 0;
  for (int attempt = 0; attempt < 12; ++attempt) {
    pid_t pid = spawn({"run", "--config", cfg, "--set", "run.output_dir=out", "--resume"}, dir / "kill.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ++kills;
    } else {
      break;  // it finished before the kill
    }
    std::string latest = ax::train::find_latest_checkpoint((dir / "out").string());
    if (latest.empty()) continue;
    INFO("after kill ", kills, ": ", latest);
    auto ck = ax::train::load_checkpoint(latest);  // throws on anything half-written
    CHECK(ck.state["step"].get<int>() >= 1);
    CHECK_NOTHROW(ax::safetensors::File::open(latest + "/adapter_model.safetensors"));
  }
  CHECK(kills >= 3);
  int rc = run({"run", "--config", cfg, "--set", "run.output_dir=out", "--resume"}, dir / "kill.log");
  INFO(slurp(dir / "kill.log"));
  REQUIRE(rc == 0);
  auto ref = step_records(dir / "ref" / "metrics.jsonl"), got = step_records(dir / "out" / "metrics.jsonl");
  REQUIRE(got.size() == static_cast<std::size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) CHECK(got[i]["loss"].get<double>() == ref[i]["loss"].get<double>());
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", kSteps);
  auto a = ax::train::load_checkpoint((dir / "ref" / "checkpoints" / name).string());
  auto b = ax::train::load_checkpoint((dir / "out" / "checkpoints" / name).string());
  REQUIRE(a.params.size() == b.params.size());
  for (const auto& [n, t] : a.params) CHECK(at::equal(t, b.params.at(n)));
  ax::test::remove_tree(dir);
}
