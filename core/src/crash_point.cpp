// See crash_point.hpp.
#include "axengine/crash_point.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax {
namespace {

struct Hooks {
  std::mutex mu;
  bool parsed = false;
  std::string spec, trace;  // as given
  std::string target;       // the armed point, "" when none
  long long k = 1;
  long long arrivals = 0;   // of the armed point so far
};

Hooks& hooks() {
  static Hooks h;
  return h;
}

// Fast path: false until a hook is configured, so an unset environment costs one relaxed load per point.
std::atomic<bool> g_active{false};

void configure(Hooks& h, const std::string& spec, const std::string& trace) {
  h.spec = spec;
  h.trace = trace;
  h.target.clear();
  h.k = 1;
  h.arrivals = 0;
  h.parsed = false;
  g_active.store(!spec.empty() || !trace.empty(), std::memory_order_relaxed);
}

// Parsed at the first arrival rather than in configure(), so a malformed value is reported as an error of the
// run (exit 2 with the variable named), not at static initialisation.
void parse(Hooks& h) {
  if (h.parsed) return;
  h.parsed = true;
  if (h.spec.empty()) return;
  std::string name = h.spec;
  if (auto at = h.spec.rfind('@'); at != std::string::npos) {
    name = h.spec.substr(0, at);
    const std::string n = h.spec.substr(at + 1);
    auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), h.k);
    if (ec != std::errc() || p != n.data() + n.size() || h.k < 1)
      throw UsageError(str("AXENGINE_TEST_CRASH_AT='", h.spec, "': the occurrence after '@' must be an integer >= 1"));
  }
  if (name.find('.') == std::string::npos || name.front() == '.' || name.back() == '.')
    throw UsageError(str("AXENGINE_TEST_CRASH_AT='", h.spec, "': expected <writer>.<step>[@<k>], e.g. checkpoint.dir_renamed@2"));
  h.target = name;
}

const bool g_from_env = [] {
  const char* at = std::getenv("AXENGINE_TEST_CRASH_AT");
  const char* trace = std::getenv("AXENGINE_TEST_CRASH_TRACE");
  configure(hooks(), at ? at : "", trace ? trace : "");
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

}  // namespace

void crash_point(std::string_view writer, std::string_view step) {
  if (!g_active.load(std::memory_order_relaxed)) return;
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  parse(h);
  const std::string name = str(writer, ".", step);
  if (!h.trace.empty()) append_trace(h.trace, name + "\n");
  if (h.target.empty() || name != h.target || ++h.arrivals != h.k) return;
  std::fprintf(stderr, "AXENGINE_TEST_CRASH_AT: killing the process at %s (arrival %lld)\n", name.c_str(), h.k);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  ::pause();  // SIGKILL cannot be caught: not reached
}

void set_crash_points_for_test(const std::string& crash_at, const std::string& trace_file) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mu);
  configure(h, crash_at, trace_file);
}

}  // namespace ax
