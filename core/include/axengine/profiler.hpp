// Kineto profiling of a region of work (some training steps, a benchmark): a Chrome trace for
// chrome://tracing / Perfetto, and a plain-text summary of where the time went, so that a user (or a
// kernel author) sees the hot kernels and the host synchronisations without leaving the terminal.
#pragma once
#include <memory>
#include <string>

namespace ax {

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
  std::string stop(const std::string& trace_path, int top = 25);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ax
