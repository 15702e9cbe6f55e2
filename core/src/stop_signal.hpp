// Graceful stop (docs/training.md, "Stopping a run"): while a StopSignals lives, the first SIGINT, SIGTERM or
// SIGUSR1 is recorded, not acted on: the trainer reads stop_signal() at its step boundaries, finishes the step,
// writes a checkpoint and exits 128 + the signal's number (130, 143, 138). A second one of them ends the process
// at once, _exit(128 + its number), without a checkpoint: the way out when the step or the save hangs.
#pragma once
#include <string>

namespace ax {

class StopSignals {
 public:
  StopSignals();   // installs the handlers (SA_RESTART: a system call in progress is resumed, not failed)
  ~StopSignals();  // puts the previous dispositions back
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The first of those signals received while a StopSignals lived, 0 while none was.
int stop_signal();
// "SIGINT", "SIGTERM", "SIGUSR1", else "signal N".
std::string signal_name(int sig);

}  // namespace ax
