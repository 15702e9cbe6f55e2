// A run that stopped on SIGINT / SIGTERM / SIGUSR1 after writing its checkpoint (docs/training.md, "Stopping a
// run"): the CLI exits 128 + signal (130, 143, 138).
#pragma once
#include <stdexcept>
#include <string>

namespace ax {

struct Interrupted : std::runtime_error {
  Interrupted(int sig, const std::string& what) : std::runtime_error(what), signal(sig) {}
  int signal;
};

}  // namespace ax
