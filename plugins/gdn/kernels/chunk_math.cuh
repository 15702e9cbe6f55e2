// The gdn plugin's kernels as block bodies: each function is what one thread block computes, written over a
// context that says which thread runs it and how many there are (`x.tid()`, `x.n()`) and where the block
// waits (`x.sync()`). nvcc compiles them as device code for kernels/linear_attention.cu; a host compiler
// compiles them with a one-thread context (HostBlock) that runs every block in turn, which is how the
// plugin's tests check the kernels' math and indexing against the reference on a machine without a GPU.
// Every element a phase writes is computed by one thread, from values the block wrote in earlier phases
// (x.sync() between them), with fixed-order loops: deterministic.
//
// The math is core's `aten` backend's (core/src/ops/aten/linear_attention.cpp, the derivation there and in
// docs/ops/linear_attention.md), over the padded chunk layout of axengine/ops/linear_attention_chunks.hpp,
// all in fp32. Per chunk c of C rows and value head h, G = cumsum(g) inside the chunk, Γ_ij = e^{G_i − G_j}:
//   ut_transform     T = (I + strict_lower(diag(β) K Kᵀ ∘ Γ))⁻¹, U = T βV, W = T βe^G K, P = (Q Kᵀ) ∘ Γ (j <= i)
//   scan_forward     per sequence, head and column tile of S: V' = U − W S_in, S ← e^{G_last} S + K_dᵀ V'
//   output_forward   O = e^G Q S_in + P V'
//   scan_backward    dV' = Pᵀ dO + K_d dS_out, dS_in = (e^G Q)ᵀ dO + e^{G_last} dS_out − Wᵀ dV'
//   chunk_backward   dQ, dK, dV, dβ and dG (before the reverse cumsum) of one chunk
#pragma once
#include <math.h>

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

// Pointers into the chunk layout, fp32 and contiguous. [NC, H, C, D] means chunk, value head, row, column.
struct Params {
  int64_t NC = 0, N = 0;  // chunk slots, sequences
  int H = 0, Dk = 0, Dv = 0;
  const int64_t* chunk_begin = nullptr;  // [N+1]: sequence b owns slots [chunk_begin[b], chunk_begin[b+1])
  const float* Q = nullptr;     // [NC, H, C, Dk] normalised, scaled, repeated to the value heads
  const float* K = nullptr;     // [NC, H, C, Dk] normalised, repeated
  const float* V = nullptr;     // [NC, H, C, Dv]
  const float* beta = nullptr;  // [NC, H, C]
  const float* G = nullptr;     // [NC, H, C] cumsum of g inside each chunk
  const float* S0 = nullptr;    // [N, H, Dk, Dv] initial states, or null (zero)
  float* Tm = nullptr;          // [NC, H, C, C] the UT transform
  float* P = nullptr;           // [NC, H, C, C] (Q Kᵀ) ∘ Γ, zero above the diagonal
  float* U = nullptr;           // [NC, H, C, Dv]
  float* W = nullptr;           // [NC, H, C, Dk]
  float* S_in = nullptr;        // [NC, H, Dk, Dv] the state entering each chunk
  float* Vn = nullptr;          // [NC, H, C, Dv] V'
  float* O = nullptr;           // [NC, H, C, Dv]
  float* final_state = nullptr; // [N, H, Dk, Dv], or null
  // backward
  const float* dO = nullptr;    // [NC, H, C, Dv]
  const float* dSf = nullptr;   // [N, H, Dk, Dv] grad_final_state, or null (zero)
  float* dS_out = nullptr;      // [NC, H, Dk, Dv] ∂L/∂S leaving each chunk
  float* dVn = nullptr;         // [NC, H, C, Dv] ∂L/∂V'
  float* dS0 = nullptr;         // [N, H, Dk, Dv] d initial_state, or null
  float* dQg = nullptr;         // [NC, H, C, Dk] scratch: ∂L/∂(e^G Q)
  float* dW = nullptr;          // [NC, H, C, Dk] scratch: ∂L/∂W
  float* dKd = nullptr;         // [NC, H, C, Dk] scratch: ∂L/∂(e^{G_last − G} K)
  float* dKbg = nullptr;        // [NC, H, C, Dk] scratch: ∂L/∂(β e^G K)
  float* dQ = nullptr;          // [NC, H, C, Dk]
  float* dK = nullptr;          // [NC, H, C, Dk]
  float* dV = nullptr;          // [NC, H, C, Dv]
  float* dbeta = nullptr;       // [NC, H, C]
  float* dG = nullptr;          // [NC, H, C] ∂L/∂G (dg is its reverse cumsum)
};

// Column tiles of the state a scan block covers.
GDN_HD int col_tiles(const Params& p) { return (p.Dv + kColTile - 1) / kColTile; }

// Shared memory (floats) each body needs.
inline int64_t ut_transform_smem(const Params&) { return 2 * kChunk + kChunk * kChunk + kChunk; }
inline int64_t scan_smem(const Params& p) { return (static_cast<int64_t>(p.Dk) + kChunk) * kColTile; }
inline int64_t chunk_backward_smem(const Params&) { return 4 * kChunk + 4 * kChunk * kChunk + 1; }

// Offsets of one chunk and head in the layouts above.
GDN_FN int64_t rows_at(const Params& p, int64_t c, int h, int D) { return ((c * p.H + h) * kChunk) * D; }
GDN_FN int64_t square_at(const Params& p, int64_t c, int h) { return (c * p.H + h) * kChunk * kChunk; }
GDN_FN int64_t vec_at(const Params& p, int64_t c, int h) { return (c * p.H + h) * kChunk; }
GDN_FN int64_t state_at(const Params& p, int64_t s, int h) { return (s * p.H + h) * static_cast<int64_t>(p.Dk) * p.Dv; }

GDN_FN float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// One block per (chunk c, head h). smem: G[C], beta[C], R[C][C] (T − I, built in place), arow[C].
template <class X>
GDN_FN void ut_transform(const X& x, const Params& p, int64_t c, int h, float* smem) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv;
  float* G = smem;
  float* beta = G + C;
  float* R = beta + C;
  float* arow = R + C * C;
  const float* K = p.K + rows_at(p, c, h, Dk);
  const float* Q = p.Q + rows_at(p, c, h, Dk);
  const float* V = p.V + rows_at(p, c, h, Dv);
  for (int i = x.tid(); i < C; i += x.n()) {
    G[i] = p.G[vec_at(p, c, h) + i];
    beta[i] = p.beta[vec_at(p, c, h) + i];
  }
  x.sync();
  // R starts as A = −L (strictly lower); P = (Q Kᵀ) ∘ Γ on and below the diagonal.
  float* P = p.P + square_at(p, c, h);
  for (int e = x.tid(); e < C * C; e += x.n()) {
    const int i = e / C, j = e % C;
    const float gamma = j <= i ? expf(G[i] - G[j]) : 0.f;
    R[e] = j < i ? -beta[i] * dot(K + i * Dk, K + j * Dk, Dk) * gamma : 0.f;
    P[e] = j <= i ? dot(Q + i * Dk, K + j * Dk, Dk) * gamma : 0.f;
  }
  x.sync();
  // Forward substitution: row i of R = A_i + A_i R (rows < i of R are final; row i's A kept in arow).
  for (int i = 1; i < C; ++i) {
    for (int j = x.tid(); j < i; j += x.n()) arow[j] = R[i * C + j];
    x.sync();
    for (int j = x.tid(); j < i; j += x.n()) {
      float s = arow[j];
      for (int m = j + 1; m < i; ++m) s += arow[m] * R[m * C + j];
      R[i * C + j] = s;
    }
    x.sync();
  }
  float* Tm = p.Tm + square_at(p, c, h);
  for (int e = x.tid(); e < C * C; e += x.n()) Tm[e] = R[e] + (e / C == e % C ? 1.f : 0.f);
  // U = T βV and W = T βe^G K (T lower triangular with a unit diagonal).
  float* U = p.U + rows_at(p, c, h, Dv);
  for (int e = x.tid(); e < C * Dv; e += x.n()) {
    const int i = e / Dv, v = e % Dv;
    float s = beta[i] * V[i * Dv + v];
    for (int j = 0; j < i; ++j) s += R[i * C + j] * beta[j] * V[j * Dv + v];
    U[e] = s;
  }
  float* W = p.W + rows_at(p, c, h, Dk);
  for (int e = x.tid(); e < C * Dk; e += x.n()) {
    const int i = e / Dk, k = e % Dk;
    float s = beta[i] * expf(G[i]) * K[i * Dk + k];
    for (int j = 0; j < i; ++j) s += R[i * C + j] * beta[j] * expf(G[j]) * K[j * Dk + k];
    W[e] = s;
  }
}

// One block per (sequence b, head h, column tile t of kColTile state columns): walks the sequence's chunks.
// smem: S[Dk][kColTile], Vt[C][kColTile].
template <class X>
GDN_FN void scan_forward(const X& x, const Params& p, int64_t b, int h, int t, float* smem) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv, v0 = t * kColTile;
  const int nv = Dv - v0 < kColTile ? Dv - v0 : kColTile;
  float* S = smem;
  float* Vt = S + Dk * kColTile;
  for (int e = x.tid(); e < Dk * nv; e += x.n()) {
    const int k = e / nv, v = e % nv;
    S[k * kColTile + v] = p.S0 ? p.S0[state_at(p, b, h) + k * Dv + v0 + v] : 0.f;
  }
  x.sync();
  for (int64_t c = p.chunk_begin[b]; c < p.chunk_begin[b + 1]; ++c) {
    const float* G = p.G + vec_at(p, c, h);
    const float* W = p.W + rows_at(p, c, h, Dk);
    const float* U = p.U + rows_at(p, c, h, Dv);
    const float* K = p.K + rows_at(p, c, h, Dk);
    float* S_in = p.S_in + state_at(p, c, h);
    float* Vn = p.Vn + rows_at(p, c, h, Dv);
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {
      const int k = e / nv, v = e % nv;
      S_in[k * Dv + v0 + v] = S[k * kColTile + v];
    }
    for (int e = x.tid(); e < C * nv; e += x.n()) {  // V' = U − W S
      const int i = e / nv, v = e % nv;
      float s = U[i * Dv + v0 + v];
      for (int k = 0; k < Dk; ++k) s -= W[i * Dk + k] * S[k * kColTile + v];
      Vt[i * kColTile + v] = s;
      Vn[i * Dv + v0 + v] = s;
    }
    x.sync();
    const float glast = G[C - 1];
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {  // S ← e^{G_last} S + K_dᵀ V'
      const int k = e / nv, v = e % nv;
      float s = expf(glast) * S[k * kColTile + v];
      for (int i = 0; i < C; ++i) s += expf(glast - G[i]) * K[i * Dk + k] * Vt[i * kColTile + v];
      S[k * kColTile + v] = s;
    }
    x.sync();
  }
  if (p.final_state)
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {
      const int k = e / nv, v = e % nv;
      p.final_state[state_at(p, b, h) + k * Dv + v0 + v] = S[k * kColTile + v];
    }
}

// One block per (chunk c, head h): O = e^G Q S_in + P V'. No shared memory.
template <class X>
GDN_FN void output_forward(const X& x, const Params& p, int64_t c, int h) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv;
  const float* G = p.G + vec_at(p, c, h);
  const float* Q = p.Q + rows_at(p, c, h, Dk);
  const float* S = p.S_in + state_at(p, c, h);
  const float* P = p.P + square_at(p, c, h);
  const float* Vn = p.Vn + rows_at(p, c, h, Dv);
  float* O = p.O + rows_at(p, c, h, Dv);
  for (int e = x.tid(); e < C * Dv; e += x.n()) {
    const int i = e / Dv, v = e % Dv;
    float a = 0.f;
    for (int k = 0; k < Dk; ++k) a += Q[i * Dk + k] * S[k * Dv + v];
    float s = expf(G[i]) * a;
    for (int j = 0; j <= i; ++j) s += P[i * C + j] * Vn[j * Dv + v];
    O[e] = s;
  }
}

// One block per (sequence b, head h, column tile t): the reverse walk. smem: dS[Dk][kColTile], dVt[C][kColTile].
template <class X>
GDN_FN void scan_backward(const X& x, const Params& p, int64_t b, int h, int t, float* smem) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv, v0 = t * kColTile;
  const int nv = Dv - v0 < kColTile ? Dv - v0 : kColTile;
  float* dS = smem;
  float* dVt = dS + Dk * kColTile;
  for (int e = x.tid(); e < Dk * nv; e += x.n()) {
    const int k = e / nv, v = e % nv;
    dS[k * kColTile + v] = p.dSf ? p.dSf[state_at(p, b, h) + k * Dv + v0 + v] : 0.f;
  }
  x.sync();
  for (int64_t c = p.chunk_begin[b + 1] - 1; c >= p.chunk_begin[b]; --c) {
    const float* G = p.G + vec_at(p, c, h);
    const float* W = p.W + rows_at(p, c, h, Dk);
    const float* K = p.K + rows_at(p, c, h, Dk);
    const float* Q = p.Q + rows_at(p, c, h, Dk);
    const float* P = p.P + square_at(p, c, h);
    const float* dO = p.dO + rows_at(p, c, h, Dv);
    float* dS_out = p.dS_out + state_at(p, c, h);
    float* dVn = p.dVn + rows_at(p, c, h, Dv);
    const float glast = G[C - 1];
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {
      const int k = e / nv, v = e % nv;
      dS_out[k * Dv + v0 + v] = dS[k * kColTile + v];
    }
    for (int e = x.tid(); e < C * nv; e += x.n()) {  // dV' = Pᵀ dO + K_d dS_out
      const int i = e / nv, v = e % nv;
      float s = 0.f;
      for (int j = i; j < C; ++j) s += P[j * C + i] * dO[j * Dv + v0 + v];
      float a = 0.f;
      for (int k = 0; k < Dk; ++k) a += K[i * Dk + k] * dS[k * kColTile + v];
      s += expf(glast - G[i]) * a;
      dVt[i * kColTile + v] = s;
      dVn[i * Dv + v0 + v] = s;
    }
    x.sync();
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {  // dS_in = (e^G Q)ᵀ dO + e^{G_last} dS_out − Wᵀ dV'
      const int k = e / nv, v = e % nv;
      float s = expf(glast) * dS[k * kColTile + v];
      for (int i = 0; i < C; ++i)
        s += expf(G[i]) * Q[i * Dk + k] * dO[i * Dv + v0 + v] - W[i * Dk + k] * dVt[i * kColTile + v];
      dS[k * kColTile + v] = s;
    }
    x.sync();
  }
  if (p.dS0)
    for (int e = x.tid(); e < Dk * nv; e += x.n()) {
      const int k = e / nv, v = e % nv;
      p.dS0[state_at(p, b, h) + k * Dv + v0 + v] = dS[k * kColTile + v];
    }
}

// One block per (chunk c, head h): every gradient of the chunk from dS_out and dV' (docs/ops/
// linear_attention.md, "Backends", and core's aten backward, step by step).
// smem: G[C], beta[C], dG[C], dbeta[C], T[C][C], dP[C][C], dL[C][C], E[C][C], dgamma.
template <class X>
GDN_FN void chunk_backward(const X& x, const Params& p, int64_t c, int h, float* smem) {
  const int C = kChunk, Dk = p.Dk, Dv = p.Dv;
  float* G = smem;
  float* beta = G + C;
  float* dGs = beta + C;
  float* dbs = dGs + C;
  float* T = dbs + C;
  float* dP = T + C * C;
  float* dL = dP + C * C;
  float* E = dL + C * C;
  float* dgamma = E + C * C;
  const float* Q = p.Q + rows_at(p, c, h, Dk);
  const float* K = p.K + rows_at(p, c, h, Dk);
  const float* V = p.V + rows_at(p, c, h, Dv);
  const float* S_in = p.S_in + state_at(p, c, h);
  const float* dS_out = p.dS_out + state_at(p, c, h);
  const float* Vn = p.Vn + rows_at(p, c, h, Dv);
  const float* dVn = p.dVn + rows_at(p, c, h, Dv);
  const float* dO = p.dO + rows_at(p, c, h, Dv);
  float* dQg = p.dQg + rows_at(p, c, h, Dk);
  float* dW = p.dW + rows_at(p, c, h, Dk);
  float* dKd = p.dKd + rows_at(p, c, h, Dk);
  float* dKbg = p.dKbg + rows_at(p, c, h, Dk);
  for (int i = x.tid(); i < C; i += x.n()) {
    G[i] = p.G[vec_at(p, c, h) + i];
    beta[i] = p.beta[vec_at(p, c, h) + i];
  }
  for (int e = x.tid(); e < C * C; e += x.n()) T[e] = p.Tm[square_at(p, c, h) + e];
  x.sync();
  const float glast = G[C - 1];
  // Through V' = U − W S_in, O = e^G Q S_in + P V', S_out = e^{G_last} S_in + K_dᵀ V'.
  for (int e = x.tid(); e < C * Dk; e += x.n()) {
    const int i = e / Dk, k = e % Dk;
    float a = 0.f, w = 0.f, d = 0.f;
    for (int v = 0; v < Dv; ++v) {
      a += dO[i * Dv + v] * S_in[k * Dv + v];
      w -= dVn[i * Dv + v] * S_in[k * Dv + v];
      d += Vn[i * Dv + v] * dS_out[k * Dv + v];
    }
    dQg[e] = a;
    dW[e] = w;
    dKd[e] = d;
  }
  if (x.tid() == 0) {  // dγ = <S_in, dS_out>, one thread: a fixed order
    float s = 0.f;
    for (int e = 0; e < Dk * Dv; ++e) s += S_in[e] * dS_out[e];
    *dgamma = s;
  }
  for (int e = x.tid(); e < C * C; e += x.n()) {
    const int i = e / C, j = e % C;
    dP[e] = j <= i ? dot(dO + i * Dv, Vn + j * Dv, Dv) : 0.f;
  }
  x.sync();
  // dT (only its strictly lower part reaches dL) into E, then dL = −Tᵀ dT Tᵀ via M = Tᵀ dT (in dL).
  for (int e = x.tid(); e < C * C; e += x.n()) {
    const int i = e / C, j = e % C;
    float s = 0.f;
    if (j < i) {
      for (int v = 0; v < Dv; ++v) s += dVn[i * Dv + v] * beta[j] * V[j * Dv + v];
      const float bg = beta[j] * expf(G[j]);
      for (int k = 0; k < Dk; ++k) s += dW[i * Dk + k] * bg * K[j * Dk + k];
    }
    E[e] = s;
  }
  x.sync();
  for (int e = x.tid(); e < C * C; e += x.n()) {  // M[i][b] = Σ_a T[a][i] dT[a][b]
    const int i = e / C, bcol = e % C;
    float s = 0.f;
    for (int a = i; a < C; ++a) s += T[a * C + i] * E[a * C + bcol];
    dL[e] = s;
  }
  x.sync();
  for (int e = x.tid(); e < C * C; e += x.n()) {  // dL[i][j] = −Σ_b M[i][b] T[j][b], strictly lower
    const int i = e / C, j = e % C;
    float s = 0.f;
    if (j < i)
      for (int bcol = 0; bcol <= j; ++bcol) s -= dL[i * C + bcol] * T[j * C + bcol];
    E[e] = s;
  }
  x.sync();
  for (int e = x.tid(); e < C * C; e += x.n()) dL[e] = E[e];
  x.sync();
  // dVβ = Tᵀ dU (dU = dV'), dKβg = Tᵀ dW.
  for (int e = x.tid(); e < C * Dv; e += x.n()) {
    const int j = e / Dv, v = e % Dv;
    float s = 0.f;
    for (int i = j; i < C; ++i) s += T[i * C + j] * dVn[i * Dv + v];
    p.dV[rows_at(p, c, h, Dv) + e] = beta[j] * s;
  }
  for (int e = x.tid(); e < C * Dk; e += x.n()) {
    const int j = e / Dk, k = e % Dk;
    float s = 0.f;
    for (int i = j; i < C; ++i) s += T[i * C + j] * dW[i * Dk + k];
    dKbg[e] = s;
  }
  x.sync();
  // Per row: dβ and dG from everything but Γ; E = dΓ ∘ Γ with dΓ = dL β_i KK + dP QK.
  for (int i = x.tid(); i < C; i += x.n()) {
    float dvb = 0.f;  // Σ_v V ∘ dVβ, with dVβ = dV / β recomputed (β may be 0 in padding rows)
    for (int v = 0; v < Dv; ++v) {
      float s = 0.f;
      for (int r = i; r < C; ++r) s += T[r * C + i] * dVn[r * Dv + v];
      dvb += V[i * Dv + v] * s;
    }
    float kk = 0.f, qd = 0.f, kd = 0.f;
    for (int k = 0; k < Dk; ++k) {
      kk += K[i * Dk + k] * dKbg[i * Dk + k];
      qd += Q[i * Dk + k] * dQg[i * Dk + k];
      kd += K[i * Dk + k] * dKd[i * Dk + k];
    }
    const float eg = expf(G[i]);
    float lrow = 0.f;
    for (int j = 0; j < i; ++j) lrow += dL[i * C + j] * dot(K + i * Dk, K + j * Dk, Dk) * expf(G[i] - G[j]);
    dbs[i] = lrow + dvb + eg * kk;
    dGs[i] = eg * qd - expf(glast - G[i]) * kd + beta[i] * eg * kk;
  }
  for (int e = x.tid(); e < C * C; e += x.n()) {
    const int i = e / C, j = e % C;
    float s = 0.f;
    if (j <= i) {
      const float gam = expf(G[i] - G[j]);
      const float kkij = j < i ? dot(K + i * Dk, K + j * Dk, Dk) : 0.f;
      s = (dL[e] * beta[i] * kkij + dP[e] * dot(Q + i * Dk, K + j * Dk, Dk)) * gam;
    }
    E[e] = s;
  }
  x.sync();
  // dG: rows minus columns of E, and the last row collects K_d's and γ's parts.
  for (int i = x.tid(); i < C; i += x.n()) {
    float s = dGs[i];
    for (int j = 0; j < C; ++j) s += E[i * C + j] - E[j * C + i];
    if (i == C - 1) {
      for (int r = 0; r < C; ++r) {
        float kd = 0.f;
        for (int k = 0; k < Dk; ++k) kd += K[r * Dk + k] * dKd[r * Dk + k];
        s += expf(glast - G[r]) * kd;
      }
      s += expf(glast) * *dgamma;
    }
    p.dG[vec_at(p, c, h) + i] = s;
    p.dbeta[vec_at(p, c, h) + i] = dbs[i];
  }
  // dQ = (dP ∘ Γ) K + e^G dQg;  dK = (dKK + dKKᵀ) K + (dP ∘ Γ)ᵀ Q + e^{G_last − G} dKd + β e^G dKβg,
  // with dKK = dL ∘ β_i Γ (strictly lower).
  for (int e = x.tid(); e < C * Dk; e += x.n()) {
    const int i = e / Dk, k = e % Dk;
    float q = expf(G[i]) * dQg[e];
    for (int j = 0; j <= i; ++j) q += dP[i * C + j] * expf(G[i] - G[j]) * K[j * Dk + k];
    p.dQ[rows_at(p, c, h, Dk) + e] = q;
    float s = expf(glast - G[i]) * dKd[e] + beta[i] * expf(G[i]) * dKbg[e];
    for (int j = 0; j < i; ++j) s += dL[i * C + j] * beta[i] * expf(G[i] - G[j]) * K[j * Dk + k];
    for (int a = i + 1; a < C; ++a) s += dL[a * C + i] * beta[a] * expf(G[a] - G[i]) * K[a * Dk + k];
    for (int a = i; a < C; ++a) s += dP[a * C + i] * expf(G[a] - G[i]) * Q[a * Dk + k];
    p.dK[rows_at(p, c, h, Dk) + e] = s;
  }
}

}  // namespace ax::gdn
