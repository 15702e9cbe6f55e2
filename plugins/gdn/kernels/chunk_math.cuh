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
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define GDN_FN __device__ __forceinline__
#define GDN_HD __host__ __device__ __forceinline__
#else
#define GDN_FN inline
#define GDN_HD inline
#endif

namespace ax::gdn {

constexpr int kChunk = 64;      // rows per chunk (C)
constexpr int kColTile = 32;    // columns of the state a scan block owns

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
};

// Column tiles of the state a scan block covers.
GDN_HD int col_tiles(const Params& p) { return (p.Dv + kColTile - 1) / kColTile; }

// Shared memory (floats) a scan block needs: the state tile [Dk][kColTile] and V' (or dV') [C][kColTile].
inline int64_t scan_smem(const Params& p) { return (static_cast<int64_t>(p.Dk) + kChunk) * kColTile; }

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

// One block per (sequence b, head h, column tile t): walks the sequence's chunks forward.
// smem: S[Dk][kColTile], Vt[C][kColTile].
template <class X>
GDN_FN void scan_forward(const X& x, const Params& p, int64_t b, int h, int t, float* smem) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv, v0 = t * kColTile;
  const int nv = Dv - v0 < kColTile ? Dv - v0 : kColTile;
  float* S = smem;
  float* Vt = S + Dk * kColTile;
  load_tile(x, p, p.S0, b, h, v0, nv, S);
  x.sync();
  for (int64_t c = p.chunk_begin[b]; c < p.chunk_begin[b + 1]; ++c) {
    const float* W = p.W + rows_at(p, c, h, Dk);
    const float* U = p.U + rows_at(p, c, h, Dv);
    const float* Kd = p.Kd + rows_at(p, c, h, Dk);
    float* Vn = p.Vn + rows_at(p, c, h, Dv);
    store_tile(x, p, S, c, h, v0, nv, p.S_in);
    for (int e = x.tid(); e < C * nv; e += x.n()) {  // V' = U − W S
      const int i = e / nv, v = e % nv;
      float s = U[i * Dv + v0 + v];
      for (int k = 0; k < Dk; ++k) s -= W[i * Dk + k] * S[k * kColTile + v];
      Vt[i * kColTile + v] = s;
      Vn[i * Dv + v0 + v] = s;
    }
    x.sync();
    const float g = p.gamma[c * p.H + h];
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {  // S ← γ S + K_dᵀ V'
      const int k = e / nv, v = e % nv;
      float s = g * S[k * kColTile + v];
      for (int i = 0; i < C; ++i) s += Kd[i * Dk + k] * Vt[i * kColTile + v];
      S[k * kColTile + v] = s;
    }
    x.sync();
  }
}

// One block per (sequence b, head h, column tile t): the reverse walk. smem: dS[Dk][kColTile], dVt[C][kColTile].
template <class X>
GDN_FN void scan_backward(const X& x, const Params& p, int64_t b, int h, int t, float* smem) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv, v0 = t * kColTile;
  const int nv = Dv - v0 < kColTile ? Dv - v0 : kColTile;
  float* dS = smem;
  float* dVt = dS + Dk * kColTile;
  load_tile(x, p, p.GF, b, h, v0, nv, dS);
  x.sync();
  for (int64_t c = p.chunk_begin[b + 1] - 1; c >= p.chunk_begin[b]; --c) {
    const float* W = p.W + rows_at(p, c, h, Dk);
    const float* Kd = p.Kd + rows_at(p, c, h, Dk);
    const float* dVl = p.dVn_local + rows_at(p, c, h, Dv);
    const float* dSl = p.dS_local + state_at(p, c, h);
    float* dVn = p.dVn + rows_at(p, c, h, Dv);
    store_tile(x, p, dS, c, h, v0, nv, p.dS_out);
    for (int e = x.tid(); e < C * nv; e += x.n()) {  // dV' = dV'_loc + K_d dS_out
      const int i = e / nv, v = e % nv;
      float s = dVl[i * Dv + v0 + v];
      for (int k = 0; k < Dk; ++k) s += Kd[i * Dk + k] * dS[k * kColTile + v];
      dVt[i * kColTile + v] = s;
      dVn[i * Dv + v0 + v] = s;
    }
    x.sync();
    const float g = p.gamma[c * p.H + h];
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {  // dS_in = dS_loc + γ dS_out − Wᵀ dV'
      const int k = e / nv, v = e % nv;
      float s = dSl[k * Dv + v0 + v] + g * dS[k * kColTile + v];
      for (int i = 0; i < C; ++i) s -= W[i * Dk + k] * dVt[i * kColTile + v];
      dS[k * kColTile + v] = s;
    }
    x.sync();
    store_tile(x, p, dS, c, h, v0, nv, p.dS_in);
  }
}

}  // namespace ax::gdn
