// The tile heuristic: picks a tile configuration (kernels/tile_configs.hpp) for a GEMM call from its
// shape and the GPU, without running anything. Plain C++: unit-tested on CPU. The tuning cache
// (tuning_cache.hpp) overrides it with measured winners; the tuner (tuner.hpp) times the candidates.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "../kernels/tile_configs.hpp"
#include "tuning_cache.hpp"

namespace ax::scattermoe {

struct TileQuery {
  GemmOp op = GemmOp::forward;
  TileVariant variant;
  // Grouped: E experts over M sorted rows, output [M, N], reduction K.
  // Gram: E experts over M rows, output per expert [N (= I), K (= J)], reduction over the expert's rows.
  int64_t E = 1, M = 0, N = 0, K = 0;
  int sms = 132;
  // Resident blocks per SM of each tile for this call's variant; 0 = not compiled (never chosen).
  std::array<int, kTileCount> occupancy{};
};

// Modelled time of one tile (arbitrary units; only comparisons mean anything); < 0 when not usable.
double modelled_cost(const TileQuery& q, int tile);
// The heuristic's choice: the smallest modelled time, the family default on ties (within 3%).
int heuristic_tile(const TileQuery& q);
// The tiles worth timing for this call (compiled, occupancy > 0, not absurd for N): what the tuner runs.
std::vector<int> candidate_tiles(const TileQuery& q);

}  // namespace ax::scattermoe
