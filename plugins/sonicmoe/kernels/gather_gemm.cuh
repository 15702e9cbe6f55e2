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
// - Halves GLU: the 256 B columns are gate columns n0..n0+127 and up columns I+n0..I+n0+127 (two TMA boxes),
//   so a tile holds both halves of each of its 128 GLU pairs. Interleaved pairs are adjacent columns.
// - The epilogue is staged through shared memory: the tile's last stage is kept from the producer until the
//   epilogue is done, and each consumer warpgroup writes its accumulators there 64 columns at a time and
//   reads them back 4 consecutive columns a thread (see the consumer loop). The fully unrolled register
//   epilogue it replaced was 8-12k instructions (dglu: 190 KB of code, streamed through the instruction
//   cache every tile) and wrote 4 bytes a thread; the staged one is ~2k and writes whole sectors. dglu
//   keeps the stage before the last as well, for u's columns of each pass, copied with cp.async.
// - The epilogue is latency-bound (8 warps an SM run it, with nothing to hide behind): what it waits on
//   is loaded in bulk (the rows' RowInfo once a tile, u once a pass), and the sigmoid is a fast division.
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
constexpr int kPrefetchSteps = 6;  // dglu: u is asked for in L2 this many k steps before the epilogue
constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
// Shared memory besides the tile table: alignment slack, the stages, the full and empty barriers, the
// tile's RowInfo (8 bytes a row) and the producers' row sources (two tiles).
constexpr size_t kSmemFixed =
    1024 + size_t(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) + kBM * 8 + 2 * kBM * sizeof(int64_t);

static_assert(kSmemFixed + sizeof(int) * (kGatherGemmMaxExperts + 1) <= 232448, "the tile table fits shared memory");

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

// __fdividef: a reciprocal and a multiply (1 / (1 + inf) is 0). The IEEE division it replaced was a
// subroutine call per element on the epilogue's critical path (the epilogue runs on 8 warps an SM, so
// its latency is not hidden).
__device__ __forceinline__ float sigmoidf(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }
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
__device__ __forceinline__ float2 bf2(uint32_t v) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v)); }
__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void st8(__nv_bfloat16* dst, float a, float b, float c, float d) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(a, b), pack_bf16(c, d));
}
__device__ __forceinline__ float4 ld4(const __nv_bfloat16* src) {  // 4 bf16, 8-byte aligned
  const uint2 v = *reinterpret_cast<const uint2*>(src);
  const float2 a = bf2(v.x), b = bf2(v.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 bias4(const __nv_bfloat16* row, int col) {
  return row == nullptr ? make_float4(0.f, 0.f, 0.f, 0.f) : ld4(row + col);
}

// A row of the tile as the epilogue needs it: active (its expert is not -1) and its routing weight (dglu),
// loaded once a tile (64 loads a warpgroup in flight together) into shared memory.
struct RowInfo {
  int active;
  float scale;
};
static_assert(sizeof(RowInfo) == 8, "kSmemFixed counts 8 bytes a row");

// Staging (the epilogue, in the tile's last stage): a warpgroup's 64 rows x 64 fp32 columns, rows
// kEpiPitch floats apart (the 8 extra floats make the accumulator-layout float2 writes conflict-free).
constexpr int kEpiPitch = 72;
constexpr uint32_t kEpiRegion = 64 * kEpiPitch * 4;
static_assert(2 * kEpiRegion + 2 * 64 * 4 <= kStageBytes, "two staging regions and the rowsums fit a stage");

// Writes accumulator group grp(sl) (8 columns: 8i + 2·(lane%4) + b in acc[4i + 2h + b], rows lane/4 + 8h
// of the warp's 16) to staging columns 8·sl.. of the warpgroup's rows.
template <class Grp>
__device__ __forceinline__ void stage_acc(float* stg, const float (&acc)[128], int warp, int lane, Grp grp) {
  const int r = warp * 16 + lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int sl = 0; sl < 8; ++sl) {
    const int i = grp(sl);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(stg + (r + 8 * h) * kEpiPitch + 8 * sl + c) =
          make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
  }
}

// dglu: copies the u columns of pass e (the GLU pairs of C's columns j0..j0+63) of the warpgroup's 64 rows
// into ubuf, 256 bytes a row (halves: 64 gate then 64 up values; interleaved: the 128 values in order),
// with cp.async: the 1024 16-byte pieces in flight together, one round trip a pass (loaded by each thread
// as it needed them, a pass made 4 round trips of ~3.3k cycles each to the busy L2).
__device__ __forceinline__ void load_u_pass(const Params& p, const Tile& tl, uint8_t* ubuf, int64_t row0, int e, int tid) {
  const int I = p.N, j0 = tl.n * kBN + 64 * e;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int id = tid + 128 * i, r = id / 16, c = id % 16;
    const int64_t m = row0 + r;
    int col;
    bool ok;
    if (p.interleaved) col = 2 * j0 + 8 * c, ok = col < 2 * I;
    else col = (c < 8 ? j0 : I + j0) + 8 * (c % 8), ok = j0 + 8 * (c % 8) < I;
    ok = ok && m < tl.end;
    cp_async16(hp::saddr(ubuf + r * 256 + c * 16), ok ? p.u + m * p.ldu + col : p.u, ok ? 16 : 0);
  }
}

// One pass of the epilogue over the staged columns of pass e (see the consumer loop): thread tid handles
// 4 consecutive staged columns of its rows.
template <int kEpi>
__device__ __forceinline__ void epi_pass(const Params& p, const Tile& tl, const float* stg, float* rsum,
                                         const RowInfo* info, const uint8_t* ubuf, int64_t row0, int e, int tid) {
  if constexpr (kEpi == int(Epi::store)) {  // out = C + bias_e (zeros for inactive rows)
    const int c4 = (tid % 16) * 4, col = tl.n * kBN + 64 * e + c4;
    const __nv_bfloat16* brow = p.bias != nullptr ? p.bias + tl.e * p.bias_estride : nullptr;
#pragma unroll 2
    for (int it = 0; it < 8; ++it) {
      const int r = 8 * it + tid / 16;
      const int64_t m = row0 + r;
      if (m >= tl.end || col >= p.N) continue;
      float4 v = *reinterpret_cast<const float4*>(stg + r * kEpiPitch + c4);
      const float4 b = bias4(brow, col);
      const bool act_row = info[r].active != 0;
      if (act_row) st8(p.out + m * p.ldo + col, v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
      else st8(p.out + m * p.ldo + col, 0.f, 0.f, 0.f, 0.f);
    }
  } else if constexpr (kEpi == int(Epi::glu)) {
    const __nv_bfloat16* brow = p.bias != nullptr ? p.bias + tl.e * p.bias_estride : nullptr;
    if (!p.interleaved) {  // staged columns c4.. are gate columns j.., c4 + 32.. their up partners I + j..
      const int I = p.N / 2, c4 = (tid % 8) * 4, j = tl.n * 128 + 32 * e + c4;
#pragma unroll 2
      for (int it = 0; it < 4; ++it) {
        const int r = 16 * it + tid / 8;
        const int64_t m = row0 + r;
        if (m >= tl.end || j >= I) continue;
        const bool act_row = info[r].active != 0;
        float4 g = *reinterpret_cast<const float4*>(stg + r * kEpiPitch + c4);
        float4 v = *reinterpret_cast<const float4*>(stg + r * kEpiPitch + 32 + c4);
        const float4 bg = bias4(brow, j), bv = bias4(brow, I + j);
        g = act_row ? make_float4(g.x + bg.x, g.y + bg.y, g.z + bg.z, g.w + bg.w) : make_float4(0.f, 0.f, 0.f, 0.f);
        v = act_row ? make_float4(v.x + bv.x, v.y + bv.y, v.z + bv.z, v.w + bv.w) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (p.uo != nullptr) {
          st8(p.uo + m * p.lduo + j, g.x, g.y, g.z, g.w);
          st8(p.uo + m * p.lduo + I + j, v.x, v.y, v.z, v.w);
        }
        if (p.out != nullptr)
          st8(p.out + m * p.ldo + j, act(p, g.x, v.x), act(p, g.y, v.y), act(p, g.z, v.z), act(p, g.w, v.w));
      }
    } else {  // u columns c.. c + 3: (gate, up) of h columns c / 2, c / 2 + 1
      const int c4 = (tid % 16) * 4, c = tl.n * kBN + 64 * e + c4;
#pragma unroll 2
      for (int it = 0; it < 8; ++it) {
        const int r = 8 * it + tid / 16;
        const int64_t m = row0 + r;
        if (m >= tl.end || c >= p.N) continue;
        const bool act_row = info[r].active != 0;
        float4 x = *reinterpret_cast<const float4*>(stg + r * kEpiPitch + c4);
        const float4 b = bias4(brow, c);
        x = act_row ? make_float4(x.x + b.x, x.y + b.y, x.z + b.z, x.w + b.w) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (p.uo != nullptr) st8(p.uo + m * p.lduo + c, x.x, x.y, x.z, x.w);
        if (p.out != nullptr)
          *reinterpret_cast<uint32_t*>(p.out + m * p.ldo + c / 2) = pack_bf16(act(p, x.x, x.y), act(p, x.z, x.w));
      }
    }
  } else {  // dglu: C = dH' (I columns j..); du = act'(u) · gate · C, h = act(u), rowsum of C · h
    const int I = p.N, c4 = (tid % 16) * 4, j = tl.n * kBN + 64 * e + c4;
    // (4 rows ahead spilled ~150 bytes a thread: the later passes' accumulators are still live here.)
    constexpr int kRowsAhead = 2;
#pragma unroll 1
    for (int it0 = 0; it0 < 8; it0 += kRowsAhead) {
      // kRowsAhead rows' u loaded together before their stores (the compiler cannot move a load of u above a
      // store to du: it does not know they never alias).
      uint2 ua[kRowsAhead], ub[kRowsAhead];  // raw bf16: halves (gate j..j+3), (up j..); interleaved u[2j..2j+7]
#pragma unroll
      for (int k = 0; k < kRowsAhead; ++k) {
        const int64_t m = row0 + 8 * (it0 + k) + tid / 16;
        ua[k] = ub[k] = make_uint2(0u, 0u);
        if (m >= tl.end || j >= I) continue;
        if (ubuf != nullptr) {  // this pass's u, copied to shared memory (load_u_pass)
          const uint8_t* ur = ubuf + (8 * (it0 + k) + tid / 16) * 256;
          ua[k] = *reinterpret_cast<const uint2*>(ur + (p.interleaved ? 4 * c4 : 2 * c4));
          ub[k] = *reinterpret_cast<const uint2*>(ur + (p.interleaved ? 4 * c4 + 8 : 128 + 2 * c4));
          continue;
        }
        const __nv_bfloat16* urow = p.u + m * p.ldu;
        const int64_t ja = p.interleaved ? 2 * j : j, jb = p.interleaved ? 2 * j + 4 : I + j;
        ua[k] = *reinterpret_cast<const uint2*>(urow + ja), ub[k] = *reinterpret_cast<const uint2*>(urow + jb);
      }
#pragma unroll
      for (int k = 0; k < kRowsAhead; ++k) {
        const int r = 8 * (it0 + k) + tid / 16;
        const int64_t m = row0 + r;
        const bool keep = m < tl.end, ok = keep && j < I;
        const bool act_row = keep && info[r].active != 0;
        const float scale = act_row ? info[r].scale : 0.f;
        const float4 cv = *reinterpret_cast<const float4*>(stg + r * kEpiPitch + c4);
        const float2 a0 = bf2(ua[k].x), a1 = bf2(ua[k].y), b0 = bf2(ub[k].x), b1 = bf2(ub[k].y);
        const float c[4] = {cv.x, cv.y, cv.z, cv.w};
        // halves: a = gate j..j+3, b = up j..j+3; interleaved: a = (g, v) of j, j + 1 and b of j + 2, j + 3
        const float g[4] = {a0.x, a0.y, a1.x, a1.y}, v[4] = {b0.x, b0.y, b1.x, b1.y};
        const float gi[4] = {a0.x, a1.x, b0.x, b1.x}, vi[4] = {a0.y, a1.y, b0.y, b1.y};
        float dg[4], dv[4], hb[4], part = 0.f;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          float hv;
          act_bwd(p, p.interleaved ? gi[b] : g[b], p.interleaved ? vi[b] : v[b], scale * c[b], hv, dg[b], dv[b]);
          hb[b] = __bfloat162float(__float2bfloat16_rn(hv));  // h as the forward rounded it
          part += c[b] * hb[b];
          if (!act_row) dg[b] = dv[b] = hb[b] = 0.f;
        }
        if (ok) {
          __nv_bfloat16* orow = p.out + m * p.ldo;
          if (!p.interleaved) {
            st8(orow + j, dg[0], dg[1], dg[2], dg[3]);
            st8(orow + I + j, dv[0], dv[1], dv[2], dv[3]);
          } else {
            st8(orow + 2 * j, dg[0], dv[0], dg[1], dv[1]);
            st8(orow + 2 * j + 4, dg[2], dv[2], dg[3], dv[3]);
          }
          if (p.ho != nullptr) st8(p.ho + m * p.ldho + j, hb[0], hb[1], hb[2], hb[3]);
        }
        // The row's 16 threads (64 columns), in a fixed order, then the passes in order: deterministic.
        part += __shfl_xor_sync(0xffffffffu, part, 8);
        part += __shfl_xor_sync(0xffffffffu, part, 4);
        part += __shfl_xor_sync(0xffffffffu, part, 2);
        part += __shfl_xor_sync(0xffffffffu, part, 1);
        if (keep && tid % 16 == 0) {
          const float total = (e == 0 ? 0.f : rsum[r]) + part;
          if (e < 3) rsum[r] = total;
          else p.rowsum[m * p.ld_rowsum + tl.n] = act_row ? total : 0.f;
        }
      }
    }
  }
}
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
  RowInfo* row_info = reinterpret_cast<RowInfo*>(empty + kStages);  // [kBM]: the epilogue's tile rows
  int64_t* row_src = reinterpret_cast<int64_t*>(row_info + kBM);     // [2][kBM], double-buffered per tile
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
      // This thread's 8 rows' sources, held in registers for the tile's k steps: read from shared memory
      // at every step (generic loads, as the compiler saw it), each copy waited on its load.
      const __nv_bfloat16* gsrc[8];
      uint32_t valid = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int64_t src = row_src[parity_buf * kBM + t / 8 + 16 * i];
        gsrc[i] = p.a + (src >= 0 ? src * p.lda : 0) + chunk * 8;
        valid |= src >= 0 ? 1u << i : 0u;
      }
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
            const uint32_t dst = sbase + row * 128 + ((chunk ^ (row % 8)) * 16);
            const bool ok = (valid >> i) & 1u;
            cp_async16(dst, ok ? gsrc[i] + kt * kBK : p.a, ok ? 16 : 0);  // src-size 0: sixteen zero bytes
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
  const int tid = threadIdx.x % 128;
  for (int ti = blockIdx.x; ti < total; ti += gridDim.x) {
    const Tile tl = tile_at(ti, tile_start, p.seg, p.E);
    const int64_t rbase = tl.row0 + cw * 64 + warp * 16 + lane / 4;
    int prev = -1;
    auto prefetch_u = [&] {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The epilogue reads this tile's u: ask L2 for it kPrefetchSteps k steps before the mainloop ends,
        // so the epilogue's loads hit L2 (asked at the tile's start, the lines were evicted again during
        // the ~35 us mainloop at qwen3-30b-a3b). A row's tile of u is two 512-byte runs (halves: gate,
        // up) or one 1 KB run (interleaved): 8 lines, two per lane of the quad.
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
    };
    // One pipeline step (scattermoe's): the LoRA step is separate code, not a branch in the loop: a wgmma
    // under a data-dependent branch makes ptxas serialise every wgmma of the kernel.
    // dglu keeps the tile's last two stages for its epilogue (the second holds the copies of u).
    const bool hold2 = kEpi == int(Epi::dglu) && k_steps >= 2;
    int left = k_steps;
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
      if (prev >= 0 && (threadIdx.x % 128) == 0 && !(hold2 && left == 1)) hp::mbar_arrive(&empty[prev]);
      --left;
      prev = s;
      if (++s == kStages) s = 0, phase ^= 1;
    };
    // (Two loops rather than a branch in one: no data-dependent branch near the wgmmas.)
    const int k_pre = kEpi == int(Epi::dglu) ? (p.k_tiles > kPrefetchSteps ? p.k_tiles - kPrefetchSteps : 0) : p.k_tiles;
    for (int kt = 0; kt < k_pre; ++kt)
      step(std::integral_constant<int, kBK / 16>{}, std::bool_constant<kBKMajor>{}, kt == 0);
    if constexpr (kEpi == int(Epi::dglu)) {
      prefetch_u();
      for (int kt = k_pre; kt < p.k_tiles; ++kt)
        step(std::integral_constant<int, kBK / 16>{}, std::bool_constant<kBKMajor>{}, kt == 0);
    }
    if constexpr (kLoraK16 > 0) step(std::integral_constant<int, kLoraK16>{}, std::bool_constant<kB2KMajor>{}, false);
    hp::wgmma_wait<0>();
    // This warpgroup's rows' expert and routing weight (RowInfo): 64 loads in flight together, under the
    // barrier below. (Loaded at the tile's start and kept through the mainloop, the one register made the
    // store kernel spill; loaded per row in the epilogue's loops, they were 32 round trips a thread.)
    int r_expert = -1;
    float r_scale = 0.f;
    if (tid < 64 && tl.row0 + cw * 64 + tid < tl.end) {
      const int64_t m = tl.row0 + cw * 64 + tid;
      r_expert = p.row_expert != nullptr ? static_cast<int>(p.row_expert[m]) : 0;
      if constexpr (kEpi == int(Epi::dglu)) r_scale = p.row_scale[m];
    }
    // The epilogue is staged through the tile's last stage, kept from the producer until the epilogue is
    // done: once both warpgroups' MMAs have read it, each warpgroup writes its 64 rows' accumulators there
    // 64 columns at a time and reads them back as 4 consecutive columns a thread, so that global loads
    // and stores are 8-16 bytes a thread and whole sectors a warp, and the loops stay rolled (small code).
    hp::bar_sync(2, 256);
    if (tid < 64) row_info[cw * 64 + tid] = RowInfo{r_expert >= 0 ? 1 : 0, r_scale};
    float* stg = reinterpret_cast<float*>(smem + prev * kStageBytes + cw * kEpiRegion);
    float* rsum = reinterpret_cast<float*>(smem + prev * kStageBytes + 2 * kEpiRegion) + cw * 64;
    const int64_t row0 = tl.row0 + cw * 64;
    const bool glu_halves = kEpi == int(Epi::glu) && !p.interleaved;
    const int pp = hold2 ? (prev + kStages - 1) % kStages : -1;  // the stage before the last, kept (dglu)
    uint8_t* ubuf = pp >= 0 ? smem + pp * kStageBytes + cw * 16384 : nullptr;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // Pass e: halves GLU stages gate groups 4e.. and their up partners 16 + 4e..; the others columns 64e..
      if (ubuf != nullptr) load_u_pass(p, tl, ubuf, row0, e, tid);  // the buffer's readers passed the barrier
      if (glu_halves) stage_acc(stg, acc, warp, lane, [&](int sl) { return sl < 4 ? 4 * e + sl : 12 + 4 * e + sl; });
      else stage_acc(stg, acc, warp, lane, [&](int sl) { return 8 * e + sl; });
      if (ubuf != nullptr) cp_async_wait_all();
      hp::bar_sync(3 + cw, 128);
      epi_pass<kEpi>(p, tl, stg, rsum, row_info + cw * 64, ubuf, row0, e, tid);
      // The staging (and u's copies) are generic-proxy writes to stages the producer's TMA (the async
      // proxy) refills after the release below.
      if (e == 3) hp::fence_proxy_async();
      hp::bar_sync(3 + cw, 128);
    }
    if (tid == 0) {
      if (pp >= 0) hp::mbar_arrive(&empty[pp]);
      hp::mbar_arrive(&empty[prev]);
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
