// The pieces the gdn scans (chunk_math.cuh) are built from, written over a block context (`x.tid()`,
// `x.n()`, `x.sync()`) so that nvcc compiles them for the GPU and a host compiler for the one-thread twin:
//   - staging: a block copies a global tile into shared memory; on the device with cp.async (16-byte copies
//     where the tile allows, else 4-byte ones), in commit groups a later wait completes, so a chunk's operands
//     load while the block computes on the previous ones; on the host a plain copy and no-op waits;
//   - the two products of a scan step, each thread owning a kRows × kCols register micro-tile of outputs and
//     reading every shared operand once per micro-tile, with the reduction in a fixed ascending order
//     (deterministic: the same bits every run, whatever the block size).
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

constexpr int kChunk = 64;    // rows per chunk (C)
constexpr int kColTile = 32;  // columns of the state a scan block owns; the row stride of its shared tiles
constexpr int kRows = 4;      // a thread's micro-tile: kRows rows ...
constexpr int kCols = 2;      // ... by kCols columns of the block's kColTile
constexpr int kColGroups = kColTile / kCols;

// Copies rows × cols floats from global `src` (row stride gs) into shared `dst` (row stride ds, a multiple of 4
// floats from a 16-byte aligned base) with the whole block. Asynchronous on the device: complete it with
// stage_commit() and stage_wait() before a x.sync().
template <class X>
GDN_FN void stage(const X& x, const float* src, int64_t gs, float* dst, int ds, int rows, int cols) {
#if defined(__CUDA_ARCH__)
  const bool wide = cols % 4 == 0 && gs % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  if (wide) {
    const int q = cols / 4;
    for (int e = x.tid(); e < rows * q; e += x.n()) {
      const int r = e / q, j = 4 * (e % q);
      const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + r * ds + j));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src + r * gs + j));
    }
  } else {
    for (int e = x.tid(); e < rows * cols; e += x.n()) {
      const int r = e / cols, j = e % cols;
      const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + r * ds + j));
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(src + r * gs + j));
    }
  }
#else
  for (int e = x.tid(); e < rows * cols; e += x.n()) dst[(e / cols) * ds + e % cols] = src[(e / cols) * gs + e % cols];
#endif
}

// Closes the group of copies this thread issued since the last commit.
GDN_FN void stage_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `pending` (0 or 1) of this thread's newest groups are still in flight.
GDN_FN void stage_wait(int pending) {
#if defined(__CUDA_ARCH__)
  if (pending > 0)
    asm volatile("cp.async.wait_group 1;\n" ::);
  else
    asm volatile("cp.async.wait_group 0;\n" ::);
#else
  (void)pending;
#endif
}

// out[i][v] = base[i][v] + sign · Σ_k Op[i][k] · St[k][v] for the chunk's rows i < kChunk and columns v < nv:
// Op [kChunk][ldk] and St [Dk][kColTile], base [kChunk][kColTile] in shared memory. Writes the result to the
// shared `tile` [kChunk][kColTile] and to global `dst` (row stride ldd). Reads no other thread's outputs.
template <class X>
GDN_FN void rows_times_state(const X& x, const float* Op, int ldk, int Dk, const float* St, const float* base,
                             float sign, int nv, float* tile, float* dst, int64_t ldd) {
  constexpr int tiles = (kChunk / kRows) * kColGroups;
  for (int m = x.tid(); m < tiles; m += x.n()) {
    const int i0 = (m / kColGroups) * kRows, v0 = (m % kColGroups) * kCols;
    if (v0 >= nv) continue;
    float acc[kRows][kCols];
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kCols; ++j) acc[r][j] = base[(i0 + r) * kColTile + v0 + j];
    for (int k = 0; k < Dk; ++k) {
      float s[kCols];
      for (int j = 0; j < kCols; ++j) s[j] = St[k * kColTile + v0 + j];
      for (int r = 0; r < kRows; ++r) {
        const float a = sign * Op[(i0 + r) * ldk + k];
        for (int j = 0; j < kCols; ++j) acc[r][j] += a * s[j];
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kCols && v0 + j < nv; ++j) {
        tile[(i0 + r) * kColTile + v0 + j] = acc[r][j];
        dst[(i0 + r) * ldd + v0 + j] = acc[r][j];
      }
  }
}

// St[k][v] = base[k][v] + g · St[k][v] + sign · Σ_i Op[i][k] · tile[i][v] for k < Dk, v < nv (base may be null:
// 0). Op [kChunk][ldk], tile [kChunk][kColTile], St and base [rows ≥ Dk rounded up to kRows][kColTile], all
// shared. Each thread reads and writes only its own micro-tile of St: in place.
template <class X>
GDN_FN void state_update(const X& x, const float* Op, int ldk, int Dk, const float* tile, const float* base, float g,
                         float sign, int nv, float* St) {
  const int tiles = (Dk + kRows - 1) / kRows * kColGroups;
  for (int m = x.tid(); m < tiles; m += x.n()) {
    const int k0 = (m / kColGroups) * kRows, v0 = (m % kColGroups) * kCols;
    if (v0 >= nv) continue;
    float acc[kRows][kCols];
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kCols; ++j) {
        const int e = (k0 + r) * kColTile + v0 + j;
        acc[r][j] = (base ? base[e] : 0.f) + g * St[e];
      }
    for (int i = 0; i < kChunk; ++i) {
      float t[kCols];
      for (int j = 0; j < kCols; ++j) t[j] = tile[i * kColTile + v0 + j];
      for (int r = 0; r < kRows; ++r) {
        const float a = sign * Op[i * ldk + k0 + r];
        for (int j = 0; j < kCols; ++j) acc[r][j] += a * t[j];
      }
    }
    for (int r = 0; r < kRows && k0 + r < Dk; ++r)
      for (int j = 0; j < kCols && v0 + j < nv; ++j) St[(k0 + r) * kColTile + v0 + j] = acc[r][j];
  }
}

}  // namespace ax::gdn
