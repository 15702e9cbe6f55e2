// The gdn plugin's kernels as block bodies: each function is what one thread block computes, written over a
// context that says which thread runs it and how many there are (`x.tid()`, `x.n()`) and where the block
// waits (`x.sync()`). nvcc compiles them as device code for kernels/linear_attention.cu; a host compiler
// compiles them with a one-thread context (HostBlock) that runs every block in turn, which is how the
// plugin's tests check the kernels' math and indexing against the reference on a machine without a GPU.
// Every element a phase writes is computed by one thread, from values the block wrote in earlier phases
// (x.sync() between them), with fixed-order loops: deterministic.
//
// They are the two sequential parts of core's shared chunked gated delta rule
// (axengine/ops/linear_attention_chunked.hpp, which computes everything chunk-parallel with batched GEMMs):
// one block per (sequence, value head, column tile of the state) walks the sequence's chunks, the state tile
// in shared memory. The columns of the state never mix (every product acts on them one by one), so the tiles
// are independent blocks.
//   scan_forward     V' = U − W S_in,               S ← γ S + K_dᵀ V'
//   scan_backward    dV' = dV'_loc + K_d dS_out,    dS_in = dS_loc + γ dS_out − Wᵀ dV'
// Per chunk, the block stages the operand of each product (W / K_d, [C, Dk]) and its addend tile in shared
// memory (tiles.cuh: cp.async on the device) and computes the product as register micro-tiles. With room for
// two operand buffers ("overlap"), the second product's operand loads while the first computes and the next
// chunk's first operand while the second computes; else one buffer serves both, loaded between the products.
#pragma once
#include <cstdint>

#include "tiles.cuh"

namespace ax::gdn {

// Pointers into core's chunk layout (GdrScanForward / GdrScanBackward), fp32 and contiguous. [NC, H, C, D]
// means chunk slot, value head, row, column.
struct Params {
  int64_t NC = 0, N = 0;  // chunk slots, sequences
  int H = 0, Dk = 0, Dv = 0;
  const int64_t* chunk_begin = nullptr;  // [N+1]: sequence b owns slots [chunk_begin[b], chunk_begin[b+1])
  const float* W = nullptr;      // [NC, H, C, Dk]
  const float* Kd = nullptr;     // [NC, H, C, Dk] e^{G_last − G} K
  const float* gamma = nullptr;  // [NC, H] e^{G_last}
  // forward
  const float* U = nullptr;      // [NC, H, C, Dv]
  const float* S0 = nullptr;     // [N(+1), H, Dk, Dv] initial states
  float* S_in = nullptr;         // [NC, H, Dk, Dv] the state entering each chunk
  float* Vn = nullptr;           // [NC, H, C, Dv] V'
  // backward
  const float* dVn_local = nullptr;  // [NC, H, C, Dv] Pᵀ dO
  const float* dS_local = nullptr;   // [NC, H, Dk, Dv] (e^G Q)ᵀ dO
  const float* GF = nullptr;         // [N(+1), H, Dk, Dv] grad_final_state
  float* dS_out = nullptr;           // [NC, H, Dk, Dv] ∂L/∂S leaving each chunk
  float* dS_in = nullptr;            // [NC, H, Dk, Dv] ∂L/∂S entering each chunk
  float* dVn = nullptr;              // [NC, H, C, Dv] ∂L/∂V'
  bool overlap = true;  // two operand buffers (ScanLayout); the glue clears it where they do not fit
};

// Column tiles of the state a scan block covers.
GDN_HD int col_tiles(const Params& p) { return (p.Dv + kColTile - 1) / kColTile; }

// A scan block's shared memory, as float offsets (each a multiple of 4: 16-byte copies land aligned):
//   S   [Dk4][kColTile]   the state (or ∂L/∂S) tile, Dk4 = Dk rounded up to kRows
//   T   [C][kColTile]     V' (or dV') of the chunk
//   R1  [C][kColTile]     the first product's addend: U (or dV'_loc)
//   R2  [Dk4][kColTile]   the second product's addend: dS_loc (backward only)
//   A   [C][ldk]          the first product's operand: W (or K_d)
//   B   [C][ldk]          the second product's operand: K_d (or W); A itself without overlap
// ldk = Dk4 + 4: rows four apart (the two row groups of a warp) fall in different banks.
struct ScanLayout {
  int ldk = 0;
  int64_t S = 0, T = 0, R1 = 0, R2 = 0, A = 0, B = 0, floats = 0;
};

GDN_HD ScanLayout scan_layout(int Dk, bool backward, bool overlap) {
  ScanLayout l;
  const int64_t dk4 = (Dk + kRows - 1) / kRows * kRows;
  l.ldk = static_cast<int>(dk4) + 4;
  l.T = l.S + dk4 * kColTile;
  l.R1 = l.T + kChunk * kColTile;
  l.R2 = l.R1 + kChunk * kColTile;
  l.A = l.R2 + (backward ? dk4 * kColTile : 0);
  l.B = overlap ? l.A + kChunk * l.ldk : l.A;
  l.floats = l.B + kChunk * l.ldk;
  return l;
}

// Shared memory (bytes) a scan block needs.
inline int64_t scan_smem_bytes(int Dk, bool backward, bool overlap) {
  return scan_layout(Dk, backward, overlap).floats * static_cast<int64_t>(sizeof(float));
}

// Offsets of one chunk and head in the layouts above.
GDN_FN int64_t rows_at(const Params& p, int64_t c, int h, int D) { return ((c * p.H + h) * kChunk) * D; }
GDN_FN int64_t state_at(const Params& p, int64_t s, int h) { return (s * p.H + h) * static_cast<int64_t>(p.Dk) * p.Dv; }

// Loads the state tile of (b, h, columns v0..v0+nv) from `from` [.., H, Dk, Dv] into S [Dk][kColTile].
template <class X>
GDN_FN void load_tile(const X& x, const Params& p, const float* from, int64_t b, int h, int v0, int nv, float* S) {
  for (int e = x.tid(); e < p.Dk * nv; e += x.n()) {
    const int k = e / nv, v = e % nv;
    S[k * kColTile + v] = from[state_at(p, b, h) + k * p.Dv + v0 + v];
  }
}

// Stores the tile S into `to` at chunk slot c.
template <class X>
GDN_FN void store_tile(const X& x, const Params& p, const float* S, int64_t c, int h, int v0, int nv, float* to) {
  for (int e = x.tid(); e < p.Dk * nv; e += x.n()) {
    const int k = e / nv, v = e % nv;
    to[state_at(p, c, h) + k * p.Dv + v0 + v] = S[k * kColTile + v];
  }
}

// Walks `count` chunks from `first` in steps of `step` (±1): per chunk, stage_a's copies complete, phase1
// runs, stage_b's copies complete, phase2 runs, then after. The copy groups: with overlap, chunk c's B loads
// during phase1(c) and chunk c+step's A during phase2(c); without, A and B share a buffer and load in turn.
template <class X, class StageA, class StageB, class Phase1, class Phase2, class After>
GDN_FN void walk_chunks(const X& x, bool overlap, int64_t first, int64_t count, int step, StageA stage_a,
                        StageB stage_b, Phase1 phase1, Phase2 phase2, After after) {
  if (count <= 0) return;
  stage_a(first);
  stage_commit();
  for (int64_t n = 0; n < count; ++n) {
    const int64_t c = first + n * step;
    const bool more = n + 1 < count;
    if (overlap) {
      stage_b(c);
      stage_commit();
    }
    stage_wait(overlap ? 1 : 0);  // A(c)
    x.sync();
    phase1(c);
    x.sync();  // A is free, T written
    if (!overlap) {
      stage_b(c);
      stage_commit();
    } else if (more) {
      stage_a(c + step);
      stage_commit();
    }
    stage_wait(overlap && more ? 1 : 0);  // B(c)
    x.sync();
    phase2(c);
    x.sync();  // B is free, the state tile final
    if (!overlap && more) {
      stage_a(c + step);
      stage_commit();
    }
    after(c);
  }
}

// One block per (sequence b, head h, column tile t): walks the sequence's chunks forward.
template <class X>
GDN_FN void scan_forward(const X& x, const Params& p, int64_t b, int h, int t, float* smem) {
  const ScanLayout l = scan_layout(p.Dk, false, p.overlap);
  const int Dk = p.Dk, Dv = p.Dv, v0 = t * kColTile;
  const int nv = Dv - v0 < kColTile ? Dv - v0 : kColTile;
  float *S = smem + l.S, *T = smem + l.T, *U = smem + l.R1, *A = smem + l.A, *B = smem + l.B;
  load_tile(x, p, p.S0, b, h, v0, nv, S);
  const int64_t c0 = p.chunk_begin[b];
  walk_chunks(
      x, p.overlap, c0, p.chunk_begin[b + 1] - c0, 1,
      [&](int64_t c) {
        stage(x, p.W + rows_at(p, c, h, Dk), Dk, A, l.ldk, kChunk, Dk);
        stage(x, p.U + rows_at(p, c, h, Dv) + v0, Dv, U, kColTile, kChunk, nv);
      },
      [&](int64_t c) { stage(x, p.Kd + rows_at(p, c, h, Dk), Dk, B, l.ldk, kChunk, Dk); },
      [&](int64_t c) {  // S_in; V' = U − W S
        store_tile(x, p, S, c, h, v0, nv, p.S_in);
        rows_times_state(x, A, l.ldk, Dk, S, U, -1.f, nv, T, p.Vn + rows_at(p, c, h, Dv) + v0, Dv);
      },
      [&](int64_t c) {  // S ← γ S + K_dᵀ V'
        state_update(x, B, l.ldk, Dk, T, static_cast<const float*>(nullptr), p.gamma[c * p.H + h], 1.f, nv, S);
      },
      [](int64_t) {});
}

// One block per (sequence b, head h, column tile t): the reverse walk.
template <class X>
GDN_FN void scan_backward(const X& x, const Params& p, int64_t b, int h, int t, float* smem) {
  const ScanLayout l = scan_layout(p.Dk, true, p.overlap);
  const int Dk = p.Dk, Dv = p.Dv, v0 = t * kColTile;
  const int nv = Dv - v0 < kColTile ? Dv - v0 : kColTile;
  float *dS = smem + l.S, *dT = smem + l.T, *dVl = smem + l.R1, *dSl = smem + l.R2, *A = smem + l.A, *B = smem + l.B;
  load_tile(x, p, p.GF, b, h, v0, nv, dS);
  const int64_t count = p.chunk_begin[b + 1] - p.chunk_begin[b];
  walk_chunks(
      x, p.overlap, p.chunk_begin[b + 1] - 1, count, -1,
      [&](int64_t c) {
        stage(x, p.Kd + rows_at(p, c, h, Dk), Dk, A, l.ldk, kChunk, Dk);
        stage(x, p.dVn_local + rows_at(p, c, h, Dv) + v0, Dv, dVl, kColTile, kChunk, nv);
      },
      [&](int64_t c) {
        stage(x, p.W + rows_at(p, c, h, Dk), Dk, B, l.ldk, kChunk, Dk);
        stage(x, p.dS_local + state_at(p, c, h) + v0, Dv, dSl, kColTile, Dk, nv);
      },
      [&](int64_t c) {  // dS_out; dV' = dV'_loc + K_d dS_out
        store_tile(x, p, dS, c, h, v0, nv, p.dS_out);
        rows_times_state(x, A, l.ldk, Dk, dS, dVl, 1.f, nv, dT, p.dVn + rows_at(p, c, h, Dv) + v0, Dv);
      },
      [&](int64_t c) {  // dS_in = dS_loc + γ dS_out − Wᵀ dV'
        state_update(x, B, l.ldk, Dk, dT, dSl, p.gamma[c * p.H + h], -1.f, nv, dS);
      },
      [&](int64_t c) { store_tile(x, p, dS, c, h, v0, nv, p.dS_in); });
}

}  // namespace ax::gdn
