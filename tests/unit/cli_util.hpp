// Running the axengine binary from tests: spawn with extra environment (the crash-point hooks), wait for the
// raw status, read what it wrote; and the tiny-Llama run directory the CLI training tests share.
#pragma once
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "unit/test_paths.hpp"
#include "unit/tiny_model.hpp"

namespace ax::test {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// Starts the axengine binary with `args` and `env` added to the environment, stdout+stderr appended to `log`.
inline pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, const EnvVars& env = {}) {
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
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

// The raw wait status (WIFSIGNALED / WTERMSIG tell a crash-point kill).
inline int run_status(const std::vector<std::string>& args, const std::filesystem::path& log, const EnvVars& env = {}) {
  int status = 0;
  ::waitpid(spawn(args, log, env), &status, 0);
  return status;
}

// The exit code; -1 when killed by a signal.
inline int run(const std::vector<std::string>& args, const std::filesystem::path& log, const EnvVars& env = {}) {
  int status = run_status(args, log, env);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Every regular file under `dir` (relative path -> bytes).
inline std::map<std::string, std::string> tree_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[std::filesystem::relative(e.path(), dir).string()] = slurp(e.path());
  return out;
}

// The per-step records ({"step", "loss", ...}) of a metrics.jsonl.
inline std::vector<nlohmann::json> step_records(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  for (const auto& line : lines_of(metrics)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j);
  }
  return out;
}

// Appended to setup_run's `train_extra` by tests whose expectations are step-exact or assume the CPU: on CUDA a
// step's metrics record is written during the next step (the loss is read without a sync), so an injected fault
// or signal at "the record of step k" is seen one step later, and GPU-only backends are available there.
inline constexpr const char* kOnCpu = "[device]\ntype = \"cpu\"\n";

// A scratch dir with a tiny Llama (model/), the one-digit sums task (data/: 80 train, 20 eval) and run.toml
// training a LoRA on it; `train_extra` continues the [train] table (and may open further tables).
inline std::filesystem::path setup_run(const std::string& name, const std::string& train_extra) {
  auto dir = scratch_dir(name);
  make_tiny_llama(dir / "model");
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

}  // namespace ax::test
