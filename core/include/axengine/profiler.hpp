// Kineto profiling of a region of work (some training steps, a benchmark): a Chrome trace for
// chrome://tracing / Perfetto, and a plain-text summary of where the time went, so that a user (or a
// kernel author) sees the hot kernels and the host synchronisations without leaving the terminal.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace ax {

// The work inside one kind of scope (a RECORD_USER_SCOPE named "axengine::…", e.g. axengine::step and
// axengine::forward_backward in the trainer), summed over its instances in the profiled region.
struct ScopeCounts {
  int64_t instances = 0;
  int64_t launches = 0;  // CUDA kernel and graph launches (runtime and driver API calls with "Launch")
  int64_t syncs = 0;     // host-synchronising CUDA calls (*Synchronize, blocking cudaMemcpy)
};

class Profiler {
 public:
  Profiler();
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Starts collecting CPU ops and, with `cuda`, GPU kernels and copies (CUPTI). Throws RuntimeError when
  // a profiler is already running in this process.
  void start(bool cuda);
  bool running() const;
  // Stops and returns the summary: GPU kernels (ATen ops on a CPU-only run) by total time (top `top`
  // rows, with calls, mean and share of GPU time), GPU busy time against wall time, the GPU's idle gaps
  // between kernels (total and the longest, with the kernels around them), the CUDA API calls by host
  // time, and the host-synchronising CUDA calls. Writes the Chrome trace to `trace_path` unless empty.
  // The summary also counts, per "axengine::" scope, the CUDA launches and host syncs issued inside it
  // (by any thread: autograd's backward threads included), also returned by scope_counts() after stop().
  std::string stop(const std::string& trace_path, int top = 25);
  const std::map<std::string, ScopeCounts>& scope_counts() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ax
