// axengine launch --nproc N [--nnodes M --node-rank I --master ADDR:PORT] -- run --config x.toml
// Starts N ranks of this node with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), for people without Python; `torchrun --no-python axengine run ...` is the same.
// When one rank fails, the others are given --grace-s to stop on their own (they see the broken group and say
// so), then SIGTERM, then SIGKILL: the launcher never waits forever. docs/distributed.md.
// A SIGINT, SIGTERM or SIGUSR1 to the launcher is passed to every rank, which stop together after the current
// step with a checkpoint (docs/training.md, "Stopping a run"); a second one is passed on too (the ranks stop at
// once), and SIGKILL follows 10 s later. The ranks run in a process group of their own, so that a terminal's
// Ctrl-C reaches them once, through the launcher, and they get SIGTERM should the launcher die.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "axengine/error.hpp"
#include "axengine/log.hpp"
#include "axengine/strings.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop_signal = 0;  // the first
volatile std::sig_atomic_t g_last_signal = 0;
volatile std::sig_atomic_t g_signals = 0;      // how many came
void on_signal(int sig) {
  if (!g_stop_signal) g_stop_signal = sig;
  g_last_signal = sig;
  g_signals = g_signals + 1;
}

// How a rank ends when it stops on a signal passed on: 128 + the signal (after its checkpoint), or killed by
// it (before its training loop began, or by a second one).
bool stopped_by_signal(int status) {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1})
    if ((WIFEXITED(status) && WEXITSTATUS(status) == 128 + sig) || (WIFSIGNALED(status) && WTERMSIG(status) == sig)) return true;
  return false;
}

// A port nobody listens on now (the kernel's pick for port 0); rank 0 binds it a moment later.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw ax::RuntimeError("launch: cannot open a socket to find a free port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  if (port <= 0) throw ax::RuntimeError("launch: cannot find a free port; give --master ADDR:PORT");
  return port;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return ax::str("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return ax::str("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "stopped";
}

struct Rank {
  int64_t rank = 0;
  pid_t pid = -1;
  bool running = true;
};

int run_launch(const std::vector<std::string>& all) {
  // Everything after "--" is the command each rank runs; before it, the launcher's own options.
  std::vector<std::string> args, command;
  bool after = false;
  for (const auto& a : all) {
    if (!after && a == "--") after = true;
    else (after ? command : args).push_back(a);
  }
  po::options_description opts("launch options");
  opts.add_options()("nproc", po::value<int64_t>(), "ranks to start on this node (one per GPU)")(
      "nnodes", po::value<int64_t>()->default_value(1), "nodes taking part (each runs this launcher)")(
      "node-rank", po::value<int64_t>()->default_value(0), "this node's index in [0, nnodes)")(
      "master", po::value<std::string>(), "ADDR:PORT of rank 0's rendezvous (node 0); default 127.0.0.1 and a free port on one node")(
      "grace-s", po::value<int64_t>()->default_value(30), "after a rank fails, seconds the others get to stop before SIGTERM");
  po::variables_map vm;
  const char* usage = "axengine launch --nproc N [--nnodes M --node-rank I --master ADDR:PORT] -- run --config FILE";
  if (!ax::cli::parse_options(usage, args, opts, vm)) return 0;
  if (!vm.count("nproc")) throw ax::UsageError(ax::str("launch: --nproc N is required (usage: ", usage, ")"));
  if (command.empty()) throw ax::UsageError(ax::str("launch: give the command the ranks run after \"--\" (usage: ", usage, ")"));
  const int64_t nproc = vm["nproc"].as<int64_t>(), nnodes = vm["nnodes"].as<int64_t>(), node = vm["node-rank"].as<int64_t>();
  const int64_t grace = vm["grace-s"].as<int64_t>();
  if (nproc < 1 || nproc > 4096) throw ax::UsageError("launch: --nproc must be in [1, 4096]");
  if (nnodes < 1 || nnodes > 65536) throw ax::UsageError("launch: --nnodes must be in [1, 65536]");
  if (node < 0 || node >= nnodes) throw ax::UsageError(ax::str("launch: --node-rank must be in [0, ", nnodes, ")"));
  if (grace < 0) throw ax::UsageError("launch: --grace-s must be >= 0");
  std::string addr = "127.0.0.1";
  int64_t port = 0;
  if (vm.count("master")) {
    const std::string m = vm["master"].as<std::string>();
    const auto colon = m.rfind(':');
    if (colon == std::string::npos || colon == 0) throw ax::UsageError(ax::str("launch: --master \"", m, "\" is not ADDR:PORT"));
    addr = m.substr(0, colon);
    try {
      std::size_t used = 0;
      port = std::stoll(m.substr(colon + 1), &used);
      if (used != m.size() - colon - 1) port = -1;
    } catch (const std::exception&) {
      port = -1;
    }
    if (port < 1 || port > 65535) throw ax::UsageError(ax::str("launch: --master \"", m, "\": the port must be in [1, 65535]"));
  } else if (nnodes > 1) {
    throw ax::UsageError("launch: --nnodes > 1 needs --master ADDR:PORT (node 0's address, the same on every node)");
  } else {
    port = free_port();
  }
  const int64_t world = nproc * nnodes;
  ax::log::info(ax::str("launch: ranks ", node * nproc, "..", node * nproc + nproc - 1, " of ", world, ", rendezvous at ", addr, ":",
                        port, ": axengine ", ax::join(command, " ")));

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  const pid_t launcher = ::getpid();

  std::vector<Rank> ranks;
  for (int64_t local = 0; local < nproc; ++local) {
    Rank r;
    r.rank = node * nproc + local;
    r.pid = ::fork();
    if (r.pid < 0) throw ax::RuntimeError(ax::str("launch: fork failed: ", std::strerror(errno)));
    if (r.pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(128 + SIGTERM);  // the launcher died before prctl took effect
      ::setenv("RANK", std::to_string(r.rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(node).c_str(), 1);
      ::setenv("MASTER_ADDR", addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv{const_cast<char*>("axengine")};
      for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "launch: rank %lld: exec failed: %s\n", static_cast<long long>(r.rank), std::strerror(errno));
      ::_exit(127);
    }
    ranks.push_back(r);
  }

  // Wait for every rank. The first failure (or a signal to the launcher) starts the clock for the others.
  int exit_code = 0;
  std::optional<Clock::time_point> failed_at;
  bool termed = false, killed = false;
  std::optional<Clock::time_point> kill_at;  // after a second signal
  int forwarded = 0;
  std::size_t running = ranks.size();
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (auto& r : ranks) {
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        --running;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && forwarded > 0 && stopped_by_signal(status)) {
          ax::log::info(ax::str("launch: rank ", r.rank, " (pid ", pid, ") stopped: it ", describe_status(status)));
        } else if (!ok) {
          ax::log::error(ax::str("launch: rank ", r.rank, " (pid ", pid, ") ", describe_status(status)));
          if (!failed_at) {
            failed_at = Clock::now();
            exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (running > 0) ax::log::error(ax::str("launch: giving the other ", running, " ranks ", grace, " s to stop"));
          }
        }
      }
      continue;
    }
    while (forwarded < g_signals) {  // each signal that came, passed on once
      const int sig = g_last_signal;
      ++forwarded;
      if (forwarded == 1) {
        ax::log::warn(ax::str("launch: got ", strsignal(sig), "; passing it to the ranks: they stop after the current step with a "
                              "checkpoint (another signal stops them at once)"));
        if (exit_code == 0) exit_code = 128 + g_stop_signal;
      } else {
        ax::log::warn(ax::str("launch: got another signal (", strsignal(sig), "); passing it on: the ranks stop at once"));
        if (!kill_at) kill_at = Clock::now() + std::chrono::seconds(10);
      }
      for (const auto& r : ranks)
        if (r.running) ::kill(r.pid, sig);
    }
    if (kill_at && Clock::now() >= *kill_at && !killed) {
      killed = true;
      for (const auto& r : ranks)
        if (r.running) ::kill(r.pid, SIGKILL);
    }
    if (failed_at) {
      const double waited = std::chrono::duration<double>(Clock::now() - *failed_at).count();
      if (!termed && waited >= static_cast<double>(grace)) {
        termed = true;
        for (const auto& r : ranks)
          if (r.running) {
            ax::log::error(ax::str("launch: rank ", r.rank, " still running; sending SIGTERM"));
            ::kill(r.pid, SIGTERM);
          }
      } else if (termed && !killed && waited >= static_cast<double>(grace) + 10) {
        killed = true;
        for (const auto& r : ranks)
          if (r.running) ::kill(r.pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (exit_code == 0) ax::log::info(ax::str("launch: all ", ranks.size(), " ranks finished"));
  return exit_code;
}

ax::cli::CommandRegistrar reg({"launch", "start N ranks of a multi-process run (torchrun's environment): launch --nproc N -- run --config FILE",
                               run_launch});

}  // namespace
