// Profiler: a thin wrapper over LibTorch's Kineto profiler (torch/csrc/autograd/profiler_kineto.h) that
// aggregates the events itself: the Python-side key_averages() table does not exist in C++.
#include "axengine/profiler.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "axengine/error.hpp"
#include "axengine/strings.hpp"

namespace ax {

namespace kp = torch::autograd::profiler;
namespace pi = torch::profiler::impl;

struct Profiler::State {
  bool running = false;
  std::chrono::steady_clock::time_point t0;
  std::map<std::string, ScopeCounts> scopes;  // of the last stop()
};

Profiler::Profiler() : state_(std::make_unique<State>()) {}
Profiler::~Profiler() {
  if (state_->running) kp::disableProfiler();  // dropped without stop(): discard, never leave it on
}

bool Profiler::running() const { return state_->running; }

const std::map<std::string, ScopeCounts>& Profiler::scope_counts() const { return state_->scopes; }

void Profiler::start(bool cuda) {
  if (state_->running || kp::isProfilerEnabledInMainThread()) throw RuntimeError("profiler: already running");
  pi::ProfilerConfig cfg(pi::ProfilerState::KINETO);
  std::set<pi::ActivityType> acts{pi::ActivityType::CPU};
  if (cuda) acts.insert(pi::ActivityType::CUDA);
  kp::prepareProfiler(cfg, acts);
  kp::enableProfiler(cfg, acts);
  state_->running = true;
  state_->t0 = std::chrono::steady_clock::now();
}

namespace {

struct Agg {
  double total_us = 0;
  int64_t calls = 0;
};

std::string fixed(double v, int prec) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// Kernel names are demangled C++ templates that run to kilobytes: keep the head.
std::string short_name(std::string n, std::size_t width = 90) {
  if (n.size() > width) n = n.substr(0, width - 3) + "...";
  return n;
}

std::vector<std::pair<std::string, Agg>> by_time(const std::map<std::string, Agg>& m) {
  std::vector<std::pair<std::string, Agg>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.total_us > b.second.total_us; });
  return v;
}

struct Span {
  int64_t start_ns, end_ns;
  std::string name;
};

// Where the GPU sat idle between its kernels and copies: the total, and the `top` longest gaps with the
// work on either side (a gap is CPU time the GPU waited for: launch overhead, host work, a sync).
std::string idle_gaps(std::vector<Span> spans, int top) {
  if (spans.size() < 2) return {};
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
  struct Gap {
    int64_t ns;
    std::size_t before;  // index of the span after the gap
    std::size_t after;   // index of the span that ended last before it
  };
  std::vector<Gap> gaps;
  int64_t idle = 0, end = spans[0].end_ns;
  std::size_t last = 0;
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].start_ns > end) {
      gaps.push_back({spans[i].start_ns - end, i, last});
      idle += spans[i].start_ns - end;
    }
    if (spans[i].end_ns >= end) end = spans[i].end_ns, last = i;
  }
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.ns > b.ns; });
  std::string out = ax::str("  GPU idle between its first and last kernel: ", fixed(idle / 1e6, 2), " ms in ", gaps.size(),
                            " gaps; longest:\n");
  for (std::size_t i = 0; i < gaps.size() && static_cast<int>(i) < top; ++i)
    out += ax::str("    ", fixed(gaps[i].ns / 1e3, 1), " us after ", short_name(spans[gaps[i].after].name, 50), "\n",
                   "             before ", short_name(spans[gaps[i].before].name, 50), "\n");
  return out;
}

bool host_sync(const std::string& n) {
  return n.find("Synchronize") != std::string::npos ||
         (n.rfind("cudaMemcpy", 0) == 0 && n.find("Async") == std::string::npos);
}

// cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel(Ex), cudaLaunchCooperativeKernel, cudaGraphLaunch.
bool launch(const std::string& n) { return n.rfind("cu", 0) == 0 && n.find("Launch") != std::string::npos; }

// The CUDA calls (by host start time) issued inside each scope instance, summed per scope name. Times are
// compared, not threads: backward runs on autograd's own threads inside the caller's scope.
std::map<std::string, ScopeCounts> count_in_scopes(const std::vector<Span>& scopes, std::vector<int64_t> launches,
                                                   std::vector<int64_t> syncs) {
  std::sort(launches.begin(), launches.end());
  std::sort(syncs.begin(), syncs.end());
  auto within = [](const std::vector<int64_t>& t, const Span& s) {
    return static_cast<int64_t>(std::upper_bound(t.begin(), t.end(), s.end_ns) - std::lower_bound(t.begin(), t.end(), s.start_ns));
  };
  std::map<std::string, ScopeCounts> out;
  for (const Span& s : scopes) {
    ScopeCounts& c = out[s.name];
    c.instances += 1;
    c.launches += within(launches, s);
    c.syncs += within(syncs, s);
  }
  return out;
}

}  // namespace

std::string Profiler::stop(const std::string& trace_path, int top) {
  if (!state_->running) throw RuntimeError("profiler: stop() without start()");
  const double wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - state_->t0).count();
  std::unique_ptr<kp::ProfilerResult> res = kp::disableProfiler();
  state_->running = false;

  std::map<std::string, Agg> gpu, cpu_ops, syncs, api;
  std::vector<Span> spans, scopes;
  std::vector<int64_t> launch_ns, sync_ns;
  double gpu_total = 0;
  for (const kp::KinetoEvent& e : res->events()) {
    const std::string name = e.name();
    const double us = static_cast<double>(e.durationNs()) / 1e3;
    if (e.deviceType() == c10::DeviceType::CUDA) {
      gpu[name].total_us += us;
      gpu[name].calls += 1;
      gpu_total += us;
      spans.push_back({static_cast<int64_t>(e.startNs()), static_cast<int64_t>(e.startNs() + e.durationNs()), name});
    } else if (name.rfind("aten::", 0) == 0) {
      cpu_ops[name].total_us += us;
      cpu_ops[name].calls += 1;
    } else {
      const auto start = static_cast<int64_t>(e.startNs());
      if (name.rfind("axengine::", 0) == 0) scopes.push_back({start, start + static_cast<int64_t>(e.durationNs()), name});
      if (host_sync(name)) {
        syncs[name].total_us += us;
        syncs[name].calls += 1;
        sync_ns.push_back(start);
      }
      if (launch(name)) launch_ns.push_back(start);
      if (name.rfind("cu", 0) == 0) {  // runtime (cuda*) and driver (cu*) API calls
        api[name].total_us += us;
        api[name].calls += 1;
      }
    }
  }
  // Without GPU events (a CPU run) the table lists ATen ops instead, by inclusive time (nested ops count
  // in their parents too).
  const bool on_gpu = !gpu.empty();
  const std::vector<std::pair<std::string, Agg>> rows = by_time(on_gpu ? gpu : cpu_ops);
  double table_total = 0;
  for (const auto& r : rows) table_total += r.second.total_us;

  std::string out = ax::str("profile: wall ", fixed(wall_us / 1e3, 1), " ms, GPU busy ", fixed(gpu_total / 1e3, 1), " ms (",
                            wall_us > 0 ? fixed(100 * gpu_total / wall_us, 1) : std::string("0"), "% of wall, kernels summed)\n");
  if (!rows.empty()) {
    out += on_gpu ? "    total ms     calls   mean us  share  GPU kernel / copy\n" : "    total ms     calls   mean us  share  CPU op (inclusive)\n";
    for (std::size_t i = 0; i < rows.size() && static_cast<int>(i) < top; ++i) {
      const Agg& a = rows[i].second;
      char line[96];
      std::snprintf(line, sizeof line, "  %10.2f %9lld %9.1f %5.1f%%  ", a.total_us / 1e3, static_cast<long long>(a.calls),
                    a.total_us / static_cast<double>(a.calls), 100 * a.total_us / table_total);
      out += line + short_name(rows[i].first) + "\n";
    }
    if (rows.size() > static_cast<std::size_t>(top)) out += ax::str("  ... ", rows.size() - static_cast<std::size_t>(top), " more\n");
  }
  out += idle_gaps(std::move(spans), 8);
  if (!api.empty()) {
    const std::vector<std::pair<std::string, Agg>> calls = by_time(api);
    out += "  CUDA API calls by host time:\n";
    for (std::size_t i = 0; i < calls.size() && i < 8; ++i)
      out += ax::str("    ", calls[i].first, ": ", calls[i].second.calls, " calls, ", fixed(calls[i].second.total_us / 1e3, 3), " ms\n");
  }
  if (!syncs.empty()) {
    out += "  host-synchronising CUDA calls:\n";
    for (const auto& [n, a] : syncs)
      out += ax::str("    ", n, ": ", a.calls, " calls, ", fixed(a.total_us / 1e3, 2), " ms\n");
  }
  state_->scopes = count_in_scopes(scopes, std::move(launch_ns), std::move(sync_ns));
  if (on_gpu && !state_->scopes.empty()) {
    out += "  CUDA calls issued inside each scope (all threads):\n";
    for (const auto& [n, c] : state_->scopes)
      out += ax::str("    ", n, ": ", c.instances, "x, ", c.launches, " launches (", fixed(static_cast<double>(c.launches) / c.instances, 1),
                     " each), ", c.syncs, " host syncs\n");
  }
  if (!trace_path.empty()) {
    res->save(trace_path);
    out += "  trace: " + trace_path + " (chrome://tracing or ui.perfetto.dev)\n";
  }
  return out;
}

}  // namespace ax
