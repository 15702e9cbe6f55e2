// The sonicmoe grouped GEMM on Hopper (sm_90a): the kernel template behind gather_gemm.hpp, instantiated
// per epilogue by gather_gemm_{store,glu,dglu}.cu. Semantics: gather_gemm.hpp; design:
// docs/plugins/sonicmoe.md.
//
// Shape (scattermoe's kernels/wgmma_gemm.cu, CUTLASS's sm90 "cooperative" GEMM), with the gather fused:
// - 384 threads: warpgroup 0 produces, warpgroups 1 and 2 consume (64 rows each of a 128 x 256 tile).
// - The store epilogue's A (h in forward, du in backward) is in sorted-row order: TMA boxes, as B, issued by
//   one producer thread (this is scattermoe's mainloop; the cp.async path below ran that GEMM ~1.6x slower).
// - Otherwise A is GATHERED: a TMA box cannot gather rows, so the 128 producer threads copy the tile's rows with
//   cp.async (16 bytes each, 8 threads per 128-byte row: each warp instruction reads 4 whole rows) into
//   the 128-byte-swizzled layout TMA would have written and wgmma reads. A row's source (its token, or
//   -1: inactive / past the expert's end -> zero fill) is looked up once per tile into shared memory.
// - B (W_e), and in the LoRA step A2 (the rows' thin product) and B2, come by TMA from the one thread
//   that also arrives with the transaction count.
// - A stage is "full" when TMA's bytes have landed and all 128 producer threads have arrived. A thread's
//   arrival is made by the hardware when its copies of the step have landed (cp.async.mbarrier.arrive
//   .noinc right after issuing them), so a producer never waits on its own copies: it runs up to kStages
//   steps ahead, bounded only by the empty barriers. (The first version waited for its copies with
//   cp.async.wait_group two steps later and arrived itself: the consumers then saw at most two stages in
//   flight, and every GEMM ran at 125-300 TFLOP/s against scattermoe's TMA-fed 500-650 on the H200.)
//   The copies are generic-proxy writes and wgmma reads through the async proxy: each consumer thread
//   issues a proxy fence after its wait on the full barrier (which acquired the copies), before the MMAs.
// - Halves GLU: the 256 B columns are gate columns n0..n0+127 and up columns I+n0..I+n0+127, so in the
//   m64n256 accumulator layout (column 8i + 2·(lane%4) + b in d[4i + 2h + b]) a thread holds gate column
//   c in d[4i + ..] and its up partner in d[4(i + 16) + ..]: the activation needs no data exchange and the
//   kernel writes H_act [M, I] only. Interleaved pairs are columns 2j, 2j+1 of one thread.
// - Persistent tile order: experts, then column tiles, then row tiles fastest (B shared in L2).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include <axengine/cuda/hopper.cuh>

#include "gather_gemm.hpp"

namespace ax::sonicmoe {
namespace hp = ax::hopper;
namespace detail {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
constexpr size_t kSmemFixed = 1024 + size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) + 2 * kBM * sizeof(int64_t);

struct Maps {
  CUtensorMap a, b, a2, b2;  // a: store only (A in row order, by TMA); gathered A is loaded with cp.async
};

struct Params {
  const int64_t* seg;
  const int64_t* row_expert;
  const __nv_bfloat16* a;
  int64_t lda;
  const int64_t* a_idx;
  int a_div;
  int E, N, k_tiles, n_tiles;
  int64_t M;
  int64_t w_erows;  // rows of one expert in B's map: K-major N, MN-major K
  int r;
  bool interleaved;
  // One GLU formula for both activations (act below): SiLU-GLU is alpha = 1, limit = inf, beta = 0; the
  // clamped GLU alpha, limit, beta = 1. Branch-free, so each epilogue holds one copy of the code.
  float alpha, limit, beta;
  const __nv_bfloat16* bias;
  int64_t bias_estride;
  __nv_bfloat16* out;
  int64_t ldo;
  __nv_bfloat16* uo;  // glu: u as well (optional)
  int64_t lduo;
  __nv_bfloat16* ho;  // dglu: h as well (optional)
  int64_t ldho;
  const __nv_bfloat16* u;
  int64_t ldu;
  const float* row_scale;
  float* rowsum;
  int64_t ld_rowsum;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
struct Tile {
  int e, n;  // expert, column tile
  int64_t row0, end;
};
__device__ __forceinline__ Tile tile_at(int t, const int* tile_start, const int64_t* seg, int E) {
  int lo = 0, hi = E - 1;  // last expert with tile_start[e] <= t (experts without rows have none)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int local = t - tile_start[lo];
  const int m_tiles = static_cast<int>((seg[lo + 1] - seg[lo] + kBM - 1) / kBM);
  return {lo, local / m_tiles, seg[lo] + int64_t(local % m_tiles) * kBM, seg[lo + 1]};
}

// The B column (of W_e as [K, N]) held in smem column c of column tile n.
template <int kEpi>
__device__ __forceinline__ int b_col(const Params& p, int n, int c) {
  if (kEpi == int(Epi::glu) && !p.interleaved) {
    const int half = p.N / 2;  // I
    return c < 128 ? n * 128 + c : half + n * 128 + (c - 128);
  }
  return n * kBN + c;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// An arrival on `bar` that the hardware makes once every cp.async this thread issued so far has landed;
// .noinc: it is one of the arrivals the barrier was initialised to expect.
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(hp::saddr(bar)) : "memory");
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }
// act(g, v) = (clamp(v, ±limit) + beta) · min(g, limit) · σ(alpha · min(g, limit)): SiLU-GLU g·σ(g)·v for
// (1, inf, 0), gpt-oss's clamped GLU for (alpha, limit, 1).
__device__ __forceinline__ float act(const Params& p, float g, float v) {
  const float gc = fminf(g, p.limit), vc = fminf(fmaxf(v, -p.limit), p.limit);
  return (vc + p.beta) * gc * sigmoidf(p.alpha * gc);
}
// h = act(g, v) and the gradients of g and v for dh (torch.clamp passes the gradient at the ends).
__device__ __forceinline__ void act_bwd(const Params& p, float g, float v, float dh, float& h, float& dg, float& dv) {
  const float gc = fminf(g, p.limit), vc = fminf(fmaxf(v, -p.limit), p.limit);
  const float s = sigmoidf(p.alpha * gc);
  h = (vc + p.beta) * gc * s;
  dg = g <= p.limit ? dh * (vc + p.beta) * (s + gc * p.alpha * s * (1.f - s)) : 0.f;
  dv = (v >= -p.limit && v <= p.limit) ? dh * gc * s : 0.f;
}
// The epilogues walk a thread's two rows (rbase, rbase + 8) with the same code: after each row the second
// row's accumulators move into the first row's slots, so the body reads acc[4i + b] only. The loop is
// unrolled: rolled (#pragma unroll 1) it halved the code but ptxas hoisted the column offsets out of it
// and spilled ~1 KB a thread in dglu, and the block ran 2-5 % slower on the H200 (session 6, call F).
__device__ __forceinline__ void next_row(float (&acc)[128]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[4 * i] = acc[4 * i + 2], acc[4 * i + 1] = acc[4 * i + 3];
}
__device__ __forceinline__ float bf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
#endif

template <bool kBKMajor>
__device__ __forceinline__ void mma_k16(float (&acc)[128], uint32_t sa, uint32_t sb, int kk, int scale_d) {
  const uint64_t da = hp::desc_sw128(sa + kk * 32, 16, 1024);
  const uint64_t db = kBKMajor ? hp::desc_sw128(sb + kk * 32, 16, 1024)
                               : hp::desc_sw128(sb + kk * 16 * 128, kBBytes / 4, 1024);
  hp::wgmma_m64n256k16<kBKMajor ? 0 : 1>(acc, da, db, scale_d);
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The TMA loads of step kt's B tile (W_e, or B2 in the LoRA step) into sb, completing on `bar`.
template <bool kBKMajor, bool kB2KMajor, int kEpi>
__device__ __forceinline__ void load_b(const Maps& maps, const Params& p, const Tile& tl, int kt, bool lora, uint8_t* sb,
                                       uint64_t* bar) {
  const CUtensorMap* mb = lora ? &maps.b2 : &maps.b;
  if (lora ? kB2KMajor : kBKMajor) {  // two boxes of 128 B columns x 64 k
    for (int hb = 0; hb < 2; ++hb) {
      const int col = b_col<kEpi>(p, tl.n, 128 * hb);
      const int c0 = lora ? tl.e * p.r : kt * kBK;
      const int c1 = lora ? col : static_cast<int>(tl.e * p.w_erows + col);
      hp::tma_load_2d(sb + hb * (kBBytes / 2), mb, bar, c0, c1);
    }
  } else {  // MN-major: four boxes of 64 columns x 64 k, 8 KB apart (the descriptor's lbo)
    const int row = lora ? tl.e * p.r : static_cast<int>(tl.e * p.w_erows + kt * kBK);
    for (int q = 0; q < 4; ++q) hp::tma_load_2d(sb + q * (kBBytes / 4), mb, bar, b_col<kEpi>(p, tl.n, 64 * q), row);
  }
}
#endif

// kBKMajor: W's orientation; kB2KMajor: B2's; kLoraK16: MMAs of the LoRA step (0: none); kEpi: Epi.
template <bool kBKMajor, bool kB2KMajor, int kLoraK16, int kEpi>
__global__ void __launch_bounds__(kThreads, 1) gather_gemm_kernel(const __grid_constant__ Maps maps, const Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  int64_t* row_src = reinterpret_cast<int64_t*>(empty + kStages);  // [2][kBM], double-buffered per tile
  int* tile_start = reinterpret_cast<int*>(row_src + 2 * kBM);     // [E + 1]
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // gathered A: 128 producer threads + the expect_tx arrival; store (A in row order, by TMA): the latter
      hp::mbar_init(&full[s], kEpi == int(Epi::store) ? 1 : 128 + 1);
      hp::mbar_init(&empty[s], 2);       // one per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    int acc = 0;
    for (int e = 0; e < p.E; ++e) {
      tile_start[e] = acc;
      acc += static_cast<int>((p.seg[e + 1] - p.seg[e] + kBM - 1) / kBM);
    }
    tile_start[p.E] = acc;
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= p.E; e += kThreads) tile_start[e] *= p.n_tiles;  // row tiles -> all tiles
  __syncthreads();
  const int total = tile_start[p.E];
  const int k_steps = p.k_tiles + (kLoraK16 > 0 ? 1 : 0);

  if (wg == 0) {  // producers
    hp::setmaxnreg_dec<72>();
    if constexpr (kEpi == int(Epi::store)) {  // A's rows in sorted order: TMA boxes, as B (one thread)
      if (threadIdx.x != 0) return;
      int step = 0;
      for (int ti = blockIdx.x; ti < total; ti += gridDim.x) {
        const Tile tl = tile_at(ti, tile_start, p.seg, p.E);
        for (int kt = 0; kt < k_steps; ++kt, ++step) {
          const int s = step % kStages;
          hp::mbar_wait(&empty[s], ((step / kStages) & 1) ^ 1);
          uint8_t* sa = smem + s * kStageBytes;
          const bool lora = kLoraK16 > 0 && kt == p.k_tiles;
          hp::mbar_expect_tx(&full[s], kStageBytes);
          hp::tma_load_2d(sa, lora ? &maps.a2 : &maps.a, &full[s], lora ? 0 : kt * kBK, static_cast<int>(tl.row0));
          load_b<kBKMajor, kB2KMajor, kEpi>(maps, p, tl, kt, lora, sa + kABytes, &full[s]);
        }
      }
      return;
    }
    const int t = threadIdx.x;
    const bool lead = t == 0;
    const int chunk = t % 8;  // this thread's 16-byte chunk of each of its rows
    int step = 0;             // global step counter: stage step % kStages, phase (step / kStages) & 1
    int parity_buf = 0;
    for (int ti = blockIdx.x; ti < total; ti += gridDim.x) {
      const Tile tl = tile_at(ti, tile_start, p.seg, p.E);
      // This tile's row sources: the buffer was last read two tiles ago, before every producer passed
      // the previous tile's barrier.
      {
        const int64_t m = tl.row0 + t;
        int64_t src = -1;
        if (m < tl.end && (p.row_expert == nullptr || p.row_expert[m] >= 0))
          src = p.a_idx != nullptr ? p.a_idx[m] / p.a_div : m;
        row_src[parity_buf * kBM + t] = src;
      }
      hp::bar_sync(1, 128);
      const int64_t* srcs = row_src + parity_buf * kBM;
      parity_buf ^= 1;
      for (int kt = 0; kt < k_steps; ++kt, ++step) {
        const int s = step % kStages;
        hp::mbar_wait(&empty[s], ((step / kStages) & 1) ^ 1);
        uint8_t* sa = smem + s * kStageBytes;
        uint8_t* sb = sa + kABytes;
        const bool lora = kLoraK16 > 0 && kt == p.k_tiles;
        if (lead) {
          hp::mbar_expect_tx(&full[s], lora ? kStageBytes : kBBytes);
          if (lora) hp::tma_load_2d(sa, &maps.a2, &full[s], 0, static_cast<int>(tl.row0));
          load_b<kBKMajor, kB2KMajor, kEpi>(maps, p, tl, kt, lora, sb, &full[s]);
        }
        if (!lora) {  // the gathered A tile: rows t/8 + 16i, chunk t%8, 128-byte swizzle
          const uint32_t sbase = hp::saddr(sa);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int row = t / 8 + 16 * i;
            const int64_t src = srcs[row];
            const uint32_t dst = sbase + row * 128 + ((chunk ^ (row % 8)) * 16);
            const __nv_bfloat16* g = src >= 0 ? p.a + src * p.lda + kt * kBK + chunk * 8 : p.a;
            cp_async16(dst, g, src >= 0 ? 16 : 0);  // src-size 0: sixteen zero bytes
          }
        }
        cp_async_arrive(&full[s]);  // (in the LoRA step: at once, the earlier steps' copies having landed)
      }
    }
    cp_async_wait_all();  // no thread leaves with copies in flight
    return;
  }

  // consumers
  hp::setmaxnreg_inc<208>();
  const int cw = wg - 1;  // rows 64·cw .. 64·cw + 63 of the tile
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  float acc[128];
  int s = 0;
  uint32_t phase = 0;
  for (int ti = blockIdx.x; ti < total; ti += gridDim.x) {
    const Tile tl = tile_at(ti, tile_start, p.seg, p.E);
    const int64_t rbase = tl.row0 + cw * 64 + warp * 16 + lane / 4;
    if constexpr (kEpi == int(Epi::dglu)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The epilogue reads this tile's u: ask L2 for it now, a whole mainloop ahead, so the epilogue's
        // loads hit L2 instead of waiting on DRAM with the MMAs idle. A row's tile of u is two 512-byte
        // runs (halves: gate, up) or one 1 KB run (interleaved): 8 lines, two per lane of the quad.
        if (rbase + 8 * h < tl.end) {
          const __nv_bfloat16* urow = p.u + (rbase + 8 * h) * p.ldu;
          const int I = p.N, q = lane % 4;
#pragma unroll
          for (int l = 0; l < 2; ++l) {
            const int line = q + 4 * l;  // 64 columns a line
            const int col = p.interleaved ? 2 * tl.n * kBN + 64 * line : (l == 0 ? 0 : I) + tl.n * kBN + 64 * q;
            if ((p.interleaved ? col < 2 * I : tl.n * kBN + 64 * q < I))
              asm volatile("prefetch.global.L2 [%0];\n" ::"l"(urow + col));
          }
        }
      }
    }
    int prev = -1;
    // One pipeline step (scattermoe's): the LoRA step is separate code, not a branch in the loop: a wgmma
    // under a data-dependent branch makes ptxas serialise every wgmma of the kernel.
    auto step = [&](auto n16, auto kmajor, bool first) {
      hp::mbar_wait(&full[s], phase);
      if constexpr (kEpi != int(Epi::store)) hp::fence_proxy_async();  // cp.async writes (generic proxy) -> wgmma
      const uint32_t sa = hp::saddr(smem + s * kStageBytes) + cw * 64 * 128;
      const uint32_t sb = hp::saddr(smem + s * kStageBytes + kABytes);
      hp::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < decltype(n16)::value; ++kk)
        mma_k16<decltype(kmajor)::value>(acc, sa, sb, kk, !first || kk != 0);
      hp::wgmma_commit();
      hp::wgmma_wait<1>();
      if (prev >= 0 && (threadIdx.x % 128) == 0) hp::mbar_arrive(&empty[prev]);
      prev = s;
      if (++s == kStages) s = 0, phase ^= 1;
    };
    for (int kt = 0; kt < p.k_tiles; ++kt)
      step(std::integral_constant<int, kBK / 16>{}, std::bool_constant<kBKMajor>{}, kt == 0);
    if constexpr (kLoraK16 > 0) step(std::integral_constant<int, kLoraK16>{}, std::bool_constant<kB2KMajor>{}, false);
    hp::wgmma_wait<0>();
    if ((threadIdx.x % 128) == 0) hp::mbar_arrive(&empty[prev]);

    const int q4 = 2 * (lane % 4);
    if constexpr (kEpi == int(Epi::store)) {
      const int n0 = tl.n * kBN;
#pragma unroll
      for (int h = 0; h < 2; ++h, next_row(acc)) {
        const int64_t m = rbase + 8 * h;
        if (m >= tl.end) continue;
        const bool act_row = p.row_expert == nullptr || p.row_expert[m] >= 0;
        __nv_bfloat16* orow = p.out + m * p.ldo;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int col = n0 + 8 * i + q4;
          if (col >= p.N) continue;
          float v0 = acc[4 * i], v1 = acc[4 * i + 1];
          if (p.bias != nullptr) {
            v0 += bf(p.bias, tl.e * p.bias_estride + col);
            v1 += bf(p.bias, tl.e * p.bias_estride + col + 1);
          }
          if (!act_row) v0 = v1 = 0.f;
          *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(v0, v1);
        }
      }
    } else if constexpr (kEpi == int(Epi::glu)) {
      const int I = p.N / 2;
      const __nv_bfloat16* brow = p.bias != nullptr ? p.bias + tl.e * p.bias_estride : nullptr;
#pragma unroll
      for (int h = 0; h < 2; ++h, next_row(acc)) {
        const int64_t m = rbase + 8 * h;
        if (m >= tl.end) continue;
        const bool act_row = p.row_expert == nullptr || p.row_expert[m] >= 0;
        __nv_bfloat16* orow = p.out != nullptr ? p.out + m * p.ldo : nullptr;
        __nv_bfloat16* urow = p.uo != nullptr ? p.uo + m * p.lduo : nullptr;
        if (!p.interleaved) {  // gate column j in d[4i + ..], its up partner I + j in d[4(i + 16) + ..]
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const int j = tl.n * 128 + 8 * i + q4;
            if (j >= I) continue;
            float g0 = acc[4 * i], g1 = acc[4 * i + 1];
            float v0 = acc[4 * (i + 16)], v1 = acc[4 * (i + 16) + 1];
            if (brow != nullptr) {
              g0 += bf(brow, j), g1 += bf(brow, j + 1);
              v0 += bf(brow, I + j), v1 += bf(brow, I + j + 1);
            }
            if (!act_row) g0 = g1 = v0 = v1 = 0.f;
            if (urow != nullptr) {
              *reinterpret_cast<__nv_bfloat162*>(urow + j) = __floats2bfloat162_rn(g0, g1);
              *reinterpret_cast<__nv_bfloat162*>(urow + I + j) = __floats2bfloat162_rn(v0, v1);
            }
            if (orow != nullptr)
              *reinterpret_cast<__nv_bfloat162*>(orow + j) = __floats2bfloat162_rn(act(p, g0, v0), act(p, g1, v1));
          }
        } else {  // u columns c, c + 1 = (gate, up) of h column c / 2
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            const int c = tl.n * kBN + 8 * i + q4;
            if (c >= p.N) continue;
            float g = acc[4 * i], v = acc[4 * i + 1];
            if (brow != nullptr) g += bf(brow, c), v += bf(brow, c + 1);
            if (!act_row) g = v = 0.f;
            if (urow != nullptr) *reinterpret_cast<__nv_bfloat162*>(urow + c) = __floats2bfloat162_rn(g, v);
            if (orow != nullptr) orow[c / 2] = __float2bfloat16_rn(act(p, g, v));
          }
        }
      }
    } else {  // dglu: C = dH' (I columns); du = act'(u) · gate · C; rowsum of C · act(u)
      const int I = p.N;
#pragma unroll
      for (int h = 0; h < 2; ++h, next_row(acc)) {
        float rs = 0.f;
        const int64_t m = rbase + 8 * h;
        const bool keep_row = m < tl.end;
        const bool act_row = keep_row && (p.row_expert == nullptr || p.row_expert[m] >= 0);
        const float row_scale = act_row ? p.row_scale[m] : 0.f;
        if (keep_row) {
          const __nv_bfloat16* urow = p.u + m * p.ldu;
          __nv_bfloat16* orow = p.out + m * p.ldo;
          __nv_bfloat16* hrow = p.ho != nullptr ? p.ho + m * p.ldho : nullptr;
          // u in chunks of 8 column groups, each chunk's loads issued together before its stores (the
          // compiler cannot move a load of u above a store to du: it does not know they never alias).
#pragma unroll
          for (int i0 = 0; i0 < 32; i0 += 8) {
            uint32_t ua[8], ub[8];  // halves: (gate j, j+1), (up j, j+1); interleaved: (g, v) of j, of j+1
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const int j = tl.n * kBN + 8 * (i0 + i) + q4;
              ua[i] = ub[i] = 0u;
              if (j >= I) continue;
              ua[i] = *reinterpret_cast<const uint32_t*>(urow + (p.interleaved ? 2 * j : j));
              ub[i] = *reinterpret_cast<const uint32_t*>(urow + (p.interleaved ? 2 * j + 2 : I + j));
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const int j = tl.n * kBN + 8 * (i0 + i) + q4;
              if (j >= I) continue;
              const float2 a0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ua[i]));
              const float2 a1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ub[i]));
              float g[2], v[2], dg[2], dv[2], hb[2];
              if (!p.interleaved) g[0] = a0.x, g[1] = a0.y, v[0] = a1.x, v[1] = a1.y;
              else g[0] = a0.x, v[0] = a0.y, g[1] = a1.x, v[1] = a1.y;
#pragma unroll
              for (int b = 0; b < 2; ++b) {
                const float c = acc[4 * (i0 + i) + b];
                float hv;
                act_bwd(p, g[b], v[b], row_scale * c, hv, dg[b], dv[b]);
                hb[b] = __bfloat162float(__float2bfloat16_rn(hv));  // h as the forward rounded it
                rs += c * hb[b];
                if (!act_row) dg[b] = dv[b] = hb[b] = 0.f;
              }
              if (hrow != nullptr) *reinterpret_cast<__nv_bfloat162*>(hrow + j) = __floats2bfloat162_rn(hb[0], hb[1]);
              if (!p.interleaved) {
                *reinterpret_cast<__nv_bfloat162*>(orow + j) = __floats2bfloat162_rn(dg[0], dg[1]);
                *reinterpret_cast<__nv_bfloat162*>(orow + I + j) = __floats2bfloat162_rn(dv[0], dv[1]);
              } else {
                *reinterpret_cast<__nv_bfloat162*>(orow + 2 * j) = __floats2bfloat162_rn(dg[0], dv[0]);
                *reinterpret_cast<__nv_bfloat162*>(orow + 2 * j + 2) = __floats2bfloat162_rn(dg[1], dv[1]);
              }
            }
          }
        }
        // The four lanes of a quad hold a row's columns: a fixed-order reduction (deterministic).
        rs += __shfl_xor_sync(0xffffffffu, rs, 1);
        rs += __shfl_xor_sync(0xffffffffu, rs, 2);
        if (keep_row && lane % 4 == 0) p.rowsum[m * p.ld_rowsum + tl.n] = act_row ? rs : 0.f;
      }
    }
  }
#endif
}

using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeFn encode_fn();
// A row-major [rows, cols] bf16 matrix (row stride ld elements) read in boxes of box_cols x box_rows.
bool encode(CUtensorMap* m, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_cols, int box_rows);
// The checks, tensor maps and parameters of a call (gather_gemm.cu); nullptr or why it cannot run.
const char* prepare(const GatherGemmArgs& a, Maps& maps, Params& p, size_t& smem, int& grid);

// Launches one instantiation (opting in to the large shared memory once per function).
template <bool kBKMajor, bool kB2KMajor, int kLoraK16, int kEpi>
void launch_one(const Maps& maps, const Params& p, size_t smem, int grid, cudaStream_t stream) {
  auto kernel = gather_gemm_kernel<kBKMajor, kB2KMajor, kLoraK16, kEpi>;
  static std::once_flag once;
  std::call_once(once, [&] { cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448); });
  kernel<<<grid, kThreads, smem, stream>>>(maps, p);
}

// Picks the LoRA MMA count: r <= 16 -> 1, else 4 (zero columns past r add nothing). Two sizes only: each
// instantiation is a large kernel to compile, and the LoRA step is one of K/64 + 1 steps either way.
template <bool kBKMajor, bool kB2KMajor, int kEpi>
void launch_rank(const Maps& maps, const Params& p, size_t smem, int grid, cudaStream_t stream) {
  if (p.r == 0) launch_one<kBKMajor, kB2KMajor, 0, kEpi>(maps, p, smem, grid, stream);
  else if (p.r <= 16) launch_one<kBKMajor, kB2KMajor, 1, kEpi>(maps, p, smem, grid, stream);
  else launch_one<kBKMajor, kB2KMajor, 4, kEpi>(maps, p, smem, grid, stream);
}

}  // namespace detail
}  // namespace ax::sonicmoe
