// Tile selection for every scattermoe GEMM launch: tuning cache, heuristic, or timing (CUDA runtime).
// One Tuner per backend object, set up from its options ([kernels.options.scattermoe], options.hpp).
//
// For each call: key (GPU, op, E, bucketed M, N, K, rank) -> tile, memoised per Tuner. On a key not
// seen yet:
//   0. option `tile` = "<name>[,<gram name>]" forces a configuration wherever it is compiled (tests and
//      benchmarks of one configuration);
//   1. the user cache file (option `tuning_cache`), then the shipped files next to the plugin (tuning_cache.hpp);
//   2. with option `tune` (and the stream not being captured into a CUDA graph), time every candidate tile
//      on the call's own arguments with CUDA events (bounded: ~0.4 s per key at most), keep the fastest,
//      store it in the user file (ignoring shipped entries, so a fill run re-measures);
//   3. otherwise the heuristic (tile_heuristic.hpp) — no timing, no synchronisation.
// Tuning reruns the kernel on the real output buffers: every launch overwrites its outputs (no
// accumulation into C), so repeating it is harmless. A call whose addend aliases its output is never tuned.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <axengine/tuning.hpp>

#include "../kernels/moe_gemm.hpp"
#include "options.hpp"
#include "tuning_cache.hpp"

namespace ax::scattermoe {

struct TileQuery;

class Tuner {
 public:
  // Takes the bound options (called once, before the first launch).
  void configure(const Options& options);

  // Launches a grouped GEMM with the selected tile (args.tile is overwritten). `rank` goes into the key.
  void grouped(GemmOp op, int64_t rank, GroupedGemmArgs args, cudaStream_t stream);
  // Launches a Gram product with the selected tile.
  void gram(GramArgs args, cudaStream_t stream);

  // The cache: the shipped files next to the plugin, then the user file; loaded on first use.
  TuningCache& cache();
  // Its own `tune` option, or a process-wide request ([compile] autotune_kernels, axengine/tuning.hpp).
  bool tuning() const { return tune_ || ax::kernel_tuning_requested(); }

 private:
  template <class Occ, class Launch>
  int select(TileQuery query, int64_t rank, bool may_tune, cudaStream_t s, Occ occupancy, Launch launch);
  int forced(TileFamily family) const;

  std::vector<int> forced_;  // tile ids, at most one per family
  bool tune_ = false;
  std::filesystem::path user_file_;
  std::once_flag cache_once_;
  std::unique_ptr<TuningCache> cache_;
  std::mutex memo_mu_;
  std::map<std::string, int> memo_;  // resolved tiles (cache hits, heuristic choices and tuning results alike)
};

}  // namespace ax::scattermoe
