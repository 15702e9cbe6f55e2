// Tile selection for every scattermoe GEMM launch: tuning cache, heuristic, or timing (CUDA runtime).
//
// For each call: key (GPU, op, E, bucketed M, N, K, rank) -> tile, memoised per process. On a key not
// seen yet in this process:
//   0. AXENGINE_SCATTERMOE_TILE=<name>[,<gram name>] forces a configuration wherever it is compiled
//      (tests and benchmarks of one configuration);
//   1. the user cache file, then the shipped files next to the plugin (tuning_cache.hpp);
//   2. with AXENGINE_SCATTERMOE_TUNE=1 (and the stream not being captured into a CUDA graph), time every
//      candidate tile on the call's own arguments with CUDA events (bounded: ~0.4 s per key at most),
//      keep the fastest, store it in the user file (ignoring shipped entries, so a fill run re-measures);
//   3. otherwise the heuristic (tile_heuristic.hpp) — no timing, no synchronisation.
// Tuning reruns the kernel on the real output buffers: every launch overwrites its outputs (no
// accumulation into C), so repeating it is harmless. A call whose addend aliases its output is never tuned.
#pragma once
#include <cstdint>

#include "../kernels/moe_gemm.hpp"
#include "tuning_cache.hpp"

namespace ax::scattermoe {

// Launches a grouped GEMM with the selected tile (args.tile is overwritten). `rank` goes into the key.
void run_grouped_tuned(GemmOp op, int64_t rank, GroupedGemmArgs args, cudaStream_t stream);
// Launches a Gram product with the selected tile.
void run_gram_tuned(GramArgs args, cudaStream_t stream);

// The process-wide cache (loaded on first use), for tests and tools.
TuningCache& tuning_cache();
// Whether AXENGINE_SCATTERMOE_TUNE asks for tuning (read once).
bool tuning_enabled();

}  // namespace ax::scattermoe
