// The tile configurations compiled into the scattermoe GEMM engine (plain C++: shared by the .cu
// instantiation files, the ATen glue, the tuning cache and its CPU unit test).
//
// Every grouped configuration can run every grouped problem (the kernel is general in M, N, K); they
// differ in speed only. To keep the build short (CI has 2 cores; each kernel instantiation costs ~8 s
// of CPU for the three architectures), only 128x128 is compiled for every variant (fp16, 64-bit
// indexing, mixed orientations of W and the fused LoRA factor); the others exist for bf16, 32-bit
// indexing and the two orientations the HF expert layout uses (both k-major, or both n-major). A call
// that a configuration does not cover runs the default (fallback_tile); with 64-bit indexing that is
// 128x128 even for thin outputs (rare sizes; correctness first).
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace ax::scattermoe {

enum class TileFamily { grouped, gram };

struct TileConfig {
  const char* name;  // stable: stored in the tuning cache
  TileFamily family;
  int bm, bn;        // tile rows x columns (gram: I x J)
  bool fp16;         // compiled for fp16 too (all are compiled for bf16)
  bool idx64;        // compiled with 64-bit index arithmetic too
  bool mixed;        // compiled for mixed orientations of W and the fused LoRA factor
};

// Ids are indices into kTileConfigs. Order is free (the cache stores names).
enum TileId : int {
  kTile128x128 = 0,  // grouped default (wide outputs)
  kTile128x64,
  kTile64x128,
  kTile64x64,
  kTile128x16,       // grouped default for thin outputs (N <= 32: the rank-r products XA, YB)
  kTile128x32,
  kTileGram128x16,   // gram default
  kTileGram128x32,
  kTileCount
};

inline constexpr TileConfig kTileConfigs[kTileCount] = {
    {"128x128", TileFamily::grouped, 128, 128, true, true, true},
    {"128x64", TileFamily::grouped, 128, 64, false, false, false},
    {"64x128", TileFamily::grouped, 64, 128, false, false, false},
    {"64x64", TileFamily::grouped, 64, 64, false, false, false},
    {"128x16", TileFamily::grouped, 128, 16, true, false, false},
    {"128x32", TileFamily::grouped, 128, 32, false, false, false},
    {"gram128x16", TileFamily::gram, 128, 16, true, true, false},
    {"gram128x32", TileFamily::gram, 128, 32, false, false, false},
};

// -1 when the name is unknown (a cache written by another build).
inline int tile_id(std::string_view name) {
  for (int i = 0; i < kTileCount; ++i)
    if (name == kTileConfigs[i].name) return i;
  return -1;
}

// The variant of a call a configuration must be compiled for.
struct TileVariant {
  TileFamily family = TileFamily::grouped;
  bool bf16 = true;
  bool idx64 = false;
  bool mixed = false;  // grouped with a fused LoRA term whose factor's orientation differs from W's
};

inline bool tile_compiled(int id, const TileVariant& v) {
  if (id < 0 || id >= kTileCount) return false;
  const TileConfig& c = kTileConfigs[id];
  return c.family == v.family && (v.bf16 || c.fp16) && (!v.idx64 || c.idx64) && (!v.mixed || c.mixed);
}

// Whether a call needs 64-bit index arithmetic: some row offset row * ld (row < M) of an operand with
// leading dimension ld could pass 2^31 - 1. Every row the kernels address is below M (sorted rows,
// scattered indices t*k+j < M, gathered rows idx / k), so M * ld <= 2^31 - 1 for every ld keeps all row
// offsets, column offsets included (cols <= ld), and all indices in 32 bits.
inline bool needs_idx64(int64_t M, std::initializer_list<int64_t> lds) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  for (int64_t ld : lds)
    if (M > 0 && ld > 0 && M > kMax / ld) return true;
  return false;
}

// The configuration that runs a call whose requested tile is not compiled for its variant (or -1, "no
// preference"): the family default, always compiled for the variant.
inline int fallback_tile(const TileVariant& v, int n) {
  if (v.family == TileFamily::gram) return kTileGram128x16;
  return (n <= 32 && !v.mixed && !v.idx64) ? kTile128x16 : kTile128x128;
}

// How many K splits a thin grouped product (N <= 32 outputs per row: the rank-r products XA, YB) of M
// sorted rows over E experts should use on a GPU with `sms` multiprocessors: enough blocks for ~4 per SM
// from the 128-row tiles the thin configurations use, at least 256 of K per split, at most 16; 1 = none.
inline int thin_split_k(int64_t M, int64_t E, int64_t N, int64_t K, int sms) {
  if (N > 32 || sms <= 0 || M <= 0) return 1;
  const int64_t tiles = (M + 127) / 128 + E;  // each expert adds at most one partial tile
  const int64_t want = (4 * static_cast<int64_t>(sms) + tiles - 1) / tiles;
  const int64_t by_k = (K + 255) / 256;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, by_k, 16})));
}

}  // namespace ax::scattermoe
