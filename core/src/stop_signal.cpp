// See stop_signal.hpp. The handler only stores the signal and writes a fixed line with write(2): both are
// async-signal-safe; everything else happens in the trainer, outside the handler.
#include "stop_signal.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "axengine/strings.hpp"

namespace ax {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGUSR1};
std::atomic<int> g_first{0};
std::atomic<int> g_count{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");

void say(const char* text) {
  ssize_t rc = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)rc;  // nothing to do about a failed write in a signal handler
}

void on_signal(int sig) {
  if (g_count.fetch_add(1) == 0) {
    g_first.store(sig);
    say(sig == SIGINT    ? "axengine: SIGINT: stopping after the current step with a checkpoint (a second signal stops at once)\n"
        : sig == SIGTERM ? "axengine: SIGTERM: stopping after the current step with a checkpoint (a second signal stops at once)\n"
                         : "axengine: SIGUSR1: stopping after the current step with a checkpoint (a second signal stops at once)\n");
    return;
  }
  say("axengine: second signal: stopping at once, without a checkpoint\n");
  ::_exit(128 + sig);
}

struct sigaction g_previous[3];

}  // namespace

StopSignals::StopSignals() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

int stop_signal() { return g_first.load(); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return str("signal ", sig);
  }
}

}  // namespace ax
