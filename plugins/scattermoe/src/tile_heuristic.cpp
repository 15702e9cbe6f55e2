// See tile_heuristic.hpp. The model: blocks of a tile are issued in waves of (SMs x resident blocks);
// a wave costs the tile's area over the SM throughput that tile shape reaches. Padding (partial M tiles
// per expert, partial N tiles) and the last partial wave are what make smaller tiles win on small or
// ragged problems; the per-shape efficiency makes 128x128 win on big ones.
#include "tile_heuristic.hpp"

namespace ax::scattermoe {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Relative tensor-core throughput of an SM full of this tile (128x128 = 1): smaller tiles load more
// operand bytes per MMA from shared memory. Rough, from the kernel's shape; tuning measures the truth.
double shape_efficiency(int bm, int bn) {
  const double area = double(bm) * bn;
  const double intensity = area / (bm + bn);  // MMAs per loaded element, 64 for 128x128
  const double e = intensity / 64.0;
  return e > 1.0 ? 1.0 : (e < 0.2 ? 0.2 : 0.55 + 0.45 * e);
}

}  // namespace

double modelled_cost(const TileQuery& q, int tile) {
  if (!tile_compiled(tile, q.variant) || q.occupancy[tile] <= 0) return -1;
  const TileConfig& c = kTileConfigs[tile];
  const int64_t E = q.E > 0 ? q.E : 1;
  const int64_t rows = q.M > 0 ? ceil_div(q.M, E) : 1;  // average rows per expert
  const int64_t slots = int64_t(q.sms > 0 ? q.sms : 1) * q.occupancy[tile];
  int64_t blocks = 0;
  double block_work = 0;  // MACs of one block, padded
  if (c.family == TileFamily::grouped) {
    // Expert sizes vary around the average: each expert pads on average half a tile of rows, and an
    // expert with any rows takes at least one tile.
    const double per_expert = double(rows) / c.bm + 0.5;
    const double m_tiles = double(E) * (per_expert < 1.0 ? 1.0 : per_expert);
    blocks = static_cast<int64_t>(m_tiles + 0.5) * ceil_div(q.N, c.bn);
    block_work = double(c.bm) * c.bn * double(ceil_div(q.K > 0 ? q.K : 1, 32) * 32);
  } else {
    blocks = E * ceil_div(q.N, c.bm) * ceil_div(q.K, c.bn);
    block_work = double(c.bm) * c.bn * double(ceil_div(rows, 32) * 32);
  }
  if (blocks <= 0) return 0;
  const int64_t waves = ceil_div(blocks, slots);
  // Each resident block gets 1/occupancy of its SM.
  return double(waves) * block_work * q.occupancy[tile] / shape_efficiency(c.bm, c.bn);
}

int heuristic_tile(const TileQuery& q) {
  int best = fallback_tile(q.variant, static_cast<int>(q.N));
  double best_cost = modelled_cost(q, best);
  for (int t = 0; t < kTileCount; ++t) {
    const double c = modelled_cost(q, t);
    if (c < 0) continue;
    if (best_cost < 0 || c < best_cost * 0.97) {
      best = t;
      best_cost = c;
    }
  }
  return best;
}

std::vector<int> candidate_tiles(const TileQuery& q) {
  std::vector<int> out;
  for (int t = 0; t < kTileCount; ++t) {
    if (modelled_cost(q, t) < 0) continue;
    const TileConfig& c = kTileConfigs[t];
    const int64_t n = c.family == TileFamily::grouped ? q.N : q.K;  // the narrow output dimension
    const int64_t n16 = ceil_div(n > 0 ? n : 1, 16) * 16;
    if (c.bn > 2 * n16 && c.bn > 16) continue;      // mostly padding
    if (n >= 128 && c.bn < 64) continue;            // thin tiles on wide outputs: never competitive
    out.push_back(t);
  }
  if (out.empty()) out.push_back(fallback_tile(q.variant, static_cast<int>(q.N)));
  return out;
}

}  // namespace ax::scattermoe
