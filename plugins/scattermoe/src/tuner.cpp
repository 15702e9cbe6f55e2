// See tuner.hpp.
#include "tuner.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <axengine/log.hpp>
#include <axengine/strings.hpp>

#include "tile_heuristic.hpp"

namespace ax::scattermoe {
namespace {
namespace fs = std::filesystem;

// Upper bound of the time spent timing one key (all candidates together, warm-ups included).
constexpr double kTuneBudgetMs = 400.0;
constexpr int kTuneReps = 3;

struct DeviceInfo {
  std::string gpu;  // "NVIDIA H200 sm_90"
  int sms = 0;
};

const DeviceInfo& device_info(int dev) {
  static std::mutex mu;
  static std::map<int, DeviceInfo> infos;
  std::lock_guard<std::mutex> lock(mu);
  auto it = infos.find(dev);
  if (it != infos.end()) return it->second;
  DeviceInfo d;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) == cudaSuccess) {
    d.gpu = ax::str(p.name, " sm_", p.major, p.minor);
    d.sms = p.multiProcessorCount;
  } else {
    cudaGetLastError();
    d.gpu = "unknown";
    d.sms = 1;
  }
  return infos.emplace(dev, d).first->second;
}

// The directory the plugin was loaded from: the shipped tuning files lie in <dir>/scattermoe_tuning/.
fs::path plugin_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&default_user_cache_path), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(info.dli_fname), ec);
  return ec ? fs::path(info.dli_fname).parent_path() : p.parent_path();
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    cudaGetLastError();
    return true;  // cannot tell: behave as under capture (no synchronisation)
  }
  return st != cudaStreamCaptureStatusNone;
}

// Times `launch(tile)` for every candidate; returns the fastest (or -1 when none ran cleanly).
template <class Launch>
int time_candidates(const std::vector<int>& cands, cudaStream_t s, Launch launch, std::string& report) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    return -1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  int best = -1;
  float best_ms = 0;
  for (int tile : cands) {
    const double spent = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (best >= 0 && spent > kTuneBudgetMs) break;  // bounded: keep what was measured so far
    // Warm-up run, timed: it also sizes the repetitions to the budget.
    cudaEventRecord(e0, s);
    launch(tile);
    cudaEventRecord(e1, s);
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaGetLastError() != cudaSuccess) {
      report += ax::str(" ", kTileConfigs[tile].name, "=failed");
      continue;
    }
    float warm = 0;
    cudaEventElapsedTime(&warm, e0, e1);
    const double left = kTuneBudgetMs / double(cands.size());
    const int reps = std::clamp(static_cast<int>(left / std::max(warm, 1e-3f)) - 1, 1, kTuneReps);
    cudaEventRecord(e0, s);
    for (int i = 0; i < reps; ++i) launch(tile);
    cudaEventRecord(e1, s);
    if (cudaEventSynchronize(e1) != cudaSuccess || cudaGetLastError() != cudaSuccess) {
      report += ax::str(" ", kTileConfigs[tile].name, "=failed");
      continue;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    ms /= reps;
    report += ax::str(" ", kTileConfigs[tile].name, "=", ms, "ms");
    if (best < 0 || ms < best_ms) {
      best = tile;
      best_ms = ms;
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

}  // namespace

void Tuner::configure(const Options& options) {
  std::string error;
  forced_ = parse_tiles(options.tile, error);  // checked when the options were bound
  tune_ = options.tune;
  user_file_ = options.tuning_cache.empty() ? default_user_cache_path() : fs::path(options.tuning_cache);
}

int Tuner::forced(TileFamily family) const {
  for (int id : forced_)
    if (kTileConfigs[id].family == family) return id;
  return -1;
}

TuningCache& Tuner::cache() {
  std::call_once(cache_once_, [this] {
    cache_ = std::make_unique<TuningCache>();
    const fs::path dir = plugin_dir();
    if (!dir.empty()) cache_->load_shipped_dir(dir / "scattermoe_tuning");
    cache_->load_user(user_file_.empty() ? default_user_cache_path() : user_file_);
  });
  return *cache_;
}

// The shared selection logic. `query` has everything but the occupancies; `occupancy(tile)` and
// `launch(tile)` talk to the kernels; `may_tune` is false when rerunning the call would be unsafe.
template <class Occ, class Launch>
int Tuner::select(TileQuery query, int64_t rank, bool may_tune, cudaStream_t s, Occ occupancy, Launch launch) {
  int dev = 0;
  cudaGetDevice(&dev);
  const DeviceInfo& di = device_info(dev);
  const std::string key =
      TuningKey{di.gpu, query.op, query.E, query.M, query.N, query.K, rank}.str();
  // The persisted key leaves out the compiled variant (dtype, 64-bit, orientations): a stored tile that
  // is not compiled for a call is skipped below. The in-process memo keeps variants apart.
  const std::string memo_key = ax::str(key, "|", query.variant.bf16, query.variant.idx64, query.variant.mixed);
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    if (auto it = memo_.find(memo_key); it != memo_.end()) return it->second;
  }
  TuningCache& cache = this->cache();
  const bool tune = tuning() && may_tune && !capturing(s);
  query.sms = di.sms;
  for (int t = 0; t < kTileCount; ++t) query.occupancy[t] = occupancy(t);

  int tile = -1;
  std::string how;
  if (const int f = forced(query.variant.family); f >= 0 && tile_compiled(f, query.variant) && query.occupancy[f] > 0) {
    tile = f;
    how = "option tile";
  }
  // While tuning, only entries measured into the user file count: a fill run re-measures shipped ones.
  if (auto name = tile < 0 ? cache.lookup(key, /*shipped=*/!tune) : std::nullopt) {
    const int id = tile_id(*name);
    if (id >= 0 && tile_compiled(id, query.variant) && query.occupancy[id] > 0) {
      tile = id;
      how = "cache";
    }
  }
  if (tile < 0 && tune) {
    const std::vector<int> cands = candidate_tiles(query);
    std::string report;
    const auto t0 = std::chrono::steady_clock::now();
    if (cands.size() == 1) {
      tile = cands[0];  // nothing to measure (e.g. fp16: defaults only); nothing stored
      how = "only candidate";
    } else {
      tile = time_candidates(cands, s, launch, report);
    }
    if (tile >= 0 && cands.size() > 1) {
      cache.store(key, kTileConfigs[tile].name);
      cache.save();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      how = ax::str("tuned in ", static_cast<int>(ms), " ms:", report);
    }
  }
  if (tile < 0) {
    tile = heuristic_tile(query);
    how = "heuristic";
  }
  const std::string line = ax::str("scattermoe: ", key, " -> ", kTileConfigs[tile].name, " (", how, ")");
  if (how.rfind("tuned", 0) == 0) ax::log::info(line);  // tuning runs are rare and worth seeing
  else ax::log::debug(line);
  std::lock_guard<std::mutex> lock(memo_mu_);
  memo_.emplace(memo_key, tile);
  return tile;
}

void Tuner::grouped(GemmOp op, int64_t rank, GroupedGemmArgs args, cudaStream_t stream) {
  // Packed weights take their fixed tile (kernels/moe_gemm_packed.cuh): the tuning keys do not carry the
  // format, so timing them would store noise under a dense key.
  if (args.wq.format != WeightFormat::dense) return grouped_gemm(args, stream);
  // The split path's LoRA add is memory-bound: its own kernel, no tile to choose.
  if (op == GemmOp::lora_add && launch_lora_add(args, stream)) return;
  TileQuery q;
  q.op = op;
  q.variant = grouped_variant(args);
  q.E = args.E;
  q.M = args.M;
  q.N = args.N;
  q.K = args.K;
  const bool may_tune = args.d == nullptr || args.d != args.c;
  args.tile = select(
      q, rank, may_tune, stream, [&](int t) { return grouped_occupancy(args, t); },
      [&](int t) {
        GroupedGemmArgs a = args;
        a.tile = t;
        grouped_gemm(a, stream);
      });
  grouped_gemm(args, stream);
}

void Tuner::gram(GramArgs args, cudaStream_t stream) {
  TileQuery q;
  q.op = GemmOp::gram;
  q.variant = gram_variant(args);
  q.E = args.E;
  q.M = args.M;
  q.N = args.I;
  q.K = args.J;
  args.tile = select(
      q, args.J, true, stream, [&](int t) { return gram_occupancy(args, t); },
      [&](int t) {
        GramArgs a = args;
        a.tile = t;
        gram_gemm(a, stream);
      });
  gram_gemm(args, stream);
}

}  // namespace ax::scattermoe
