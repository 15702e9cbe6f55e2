// See crash_point.hpp.
#include "axengine/crash_point.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "stop_signal.hpp"

namespace ax {
namespace {

enum class Action { kill, signal, pause, fail };

struct HookVar {
  const char* name;
  Action action;
};
constexpr HookVar kVars[] = {{"AXENGINE_TEST_CRASH_AT", Action::kill},
                             {"AXENGINE_TEST_SIGNAL_AT", Action::signal},
                             {"AXENGINE_TEST_PAUSE_AT", Action::pause},
                             {"AXENGINE_TEST_WRITE_FAIL_AT", Action::fail}};

// One armed point: what happens at its k-th arrival.
struct Arm {
  Action action = Action::kill;
  std::string point;
  long long k = 1;
  long long arrivals = 0;
  int sig = SIGTERM;
};

struct Hooks {
  std::mutex mu;
  bool parsed = false;
  std::map<std::string, std::string> specs;  // variable -> value as given ("" = unset)
  std::string trace;
  std::vector<Arm> arms;
};

Hooks& hooks() {
  static Hooks h;
  return h;
}

// Fast path: false until a hook is configured, so an unset environment costs one relaxed load per point.
std::atomic<bool> g_active{false};

void update_active(Hooks& h) {
  bool any = !h.trace.empty();
  for (const auto& [var, spec] : h.specs) any |= !spec.empty();
  h.parsed = false;
  h.arms.clear();
  g_active.store(any, std::memory_order_relaxed);
}

// "<writer>.<step>[@<k>]" (and for signals a ":<SIG>" after it).
Arm parse_arm(const std::string& var, const std::string& whole, std::string item, Action action) {
  Arm a;
  a.action = action;
  if (action == Action::signal)
    if (auto colon = item.rfind(':'); colon != std::string::npos) {
      const std::string s = item.substr(colon + 1);
      item = item.substr(0, colon);
      a.sig = s == "INT" ? SIGINT : s == "TERM" ? SIGTERM : s == "USR1" ? SIGUSR1 : 0;
      if (!a.sig) throw UsageError(str(var, "='", whole, "': the signal after ':' must be INT, TERM or USR1"));
    }
  a.point = item;
  if (auto at = item.rfind('@'); at != std::string::npos) {
    a.point = item.substr(0, at);
    const std::string n = item.substr(at + 1);
    auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), a.k);
    if (ec != std::errc() || p != n.data() + n.size() || a.k < 1)
      throw UsageError(str(var, "='", whole, "': the occurrence after '@' must be an integer >= 1"));
  }
  if (a.point.find('.') == std::string::npos || a.point.front() == '.' || a.point.back() == '.')
    throw UsageError(str(var, "='", whole, "': expected <writer>.<step>[@<k>], e.g. checkpoint.dir_renamed@2"));
  return a;
}

// Parsed at the first arrival rather than when configured, so a malformed value is reported as an error of the
// run (exit 2 with the variable named), not at static initialisation.
void parse(Hooks& h) {
  if (h.parsed) return;
  h.parsed = true;
  for (const auto& v : kVars) {
    const std::string& spec = h.specs[v.name];
    if (spec.empty()) continue;
    if (v.action != Action::signal) {
      h.arms.push_back(parse_arm(v.name, spec, spec, v.action));
      continue;
    }
    std::size_t from = 0;
    while (from <= spec.size()) {
      std::size_t comma = spec.find(',', from);
      if (comma == std::string::npos) comma = spec.size();
      h.arms.push_back(parse_arm(v.name, spec, spec.substr(from, comma - from), v.action));
      from = comma + 1;
    }
  }
}

const bool g_from_env = [] {
  Hooks& h = hooks();
  for (const auto& v : kVars) {
    const char* value = std::getenv(v.name);
    h.specs[v.name] = value ? value : "";
  }
  const char* trace = std::getenv("AXENGINE_TEST_CRASH_TRACE");
  h.trace = trace ? trace : "";
  update_active(h);
  return true;
}();

void append_trace(const std::string& file, const std::string& line) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeError(str("AXENGINE_TEST_CRASH_TRACE=", file, ": cannot open for appending"));
  // One write of a short line with O_APPEND: lines from threads or processes sharing the file never interleave.
  ssize_t w = ::write(fd, line.data(), line.size());
  ::close(fd);
  if (w != static_cast<ssize_t>(line.size())) throw RuntimeError(str("AXENGINE_TEST_CRASH_TRACE=", file, ": write failed"));
}

void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace

void crash_point(std::string_view writer, std::string_view step) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  Hooks& h = hooks();
  const std::string name = str(writer, ".", step);
  std::vector<Arm> due;  // acted on outside the lock: a paused point must not hold up other threads' points
  {
    std::lock_guard<std::mutex> lock(h.mu);
    parse(h);
    if (!h.trace.empty()) append_trace(h.trace, name + "\n");
    for (auto& a : h.arms)
      if (a.action != Action::fail && a.point == name && ++a.arrivals == a.k) due.push_back(a);
  }
  for (const auto& a : due) {
    if (a.action == Action::kill) {
      say(str("AXENGINE_TEST_CRASH_AT: killing the process at ", name, " (arrival ", a.k, ")"));
      ::kill(::getpid(), SIGKILL);
      ::pause();  // SIGKILL cannot be caught: not reached
    } else if (a.action == Action::signal) {
      say(str("AXENGINE_TEST_SIGNAL_AT: raising ", signal_name(a.sig), " at ", name, " (arrival ", a.k, ")"));
      ::raise(a.sig);  // to this thread: its handler has run when raise returns
    } else {
      say(str("AXENGINE_TEST_PAUSE_AT: paused at ", name, " (pid ", ::getpid(), ")"));
      while (stop_signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

bool write_fails_here(std::string_view writer, std::string_view step) {
  if (!g_active.load(std::memory_order_relaxed)) return false;
  Hooks& h = hooks();
  const std::string name = str(writer, ".", step);
  std::lock_guard<std::mutex> lock(h.mu);
  parse(h);
  bool fail = false;
  for (auto& a : h.arms)
    if (a.action == Action::fail && a.point == name && ++a.arrivals == a.k) fail = true;
  return fail;
}

void set_crash_points_for_test(const std::string& crash_at, const std::string& trace_file) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  for (const auto& v : kVars) h.specs[v.name] = "";
  h.specs["AXENGINE_TEST_CRASH_AT"] = crash_at;
  h.trace = trace_file;
  update_active(h);
}

void set_test_hook_for_test(const std::string& variable, const std::string& value) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  if (!h.specs.count(variable)) throw UsageError(str("set_test_hook_for_test: unknown hook variable ", variable));
  h.specs[variable] = value;
  update_active(h);
}

}  // namespace ax
