// The split path's grouped GEMM on Hopper (sm_90a): TMA loads, warpgroup MMAs (wgmma), and the LoRA
// product folded in as one extra K tile, so Y = X·W_e + s·XA·B_eᵀ (+ bias) leaves the kernel finished
// (no second pass over Y). Interface and semantics: moe_gemm.hpp, WgmmaGemmArgs.
//
// Shape of the kernel (the warp-specialised, persistent design of CUTLASS's sm90 "cooperative" GEMM):
// - 384 threads: warpgroup 0 is the producer (one thread issues the TMA loads), warpgroups 1 and 2 are
//   consumers, each owning 64 rows of the 128 x 256 output tile.
// - A ring of 4 stages of (A 128x64, B 256x64) bf16 tiles, 128-byte swizzled as TMA writes them and
//   wgmma reads them; "full" barriers complete on the TMA bytes, "empty" barriers on one arrival per
//   consumer warpgroup once its MMAs that read the stage have retired.
// - Persistent: gridDim.x = SM count, CTAs stride over the tiles of all experts (experts in order, then
//   column tiles, then row tiles fastest, so CTAs running together share the B tiles in L2).
// - Row tiles never mix experts: a tile's rows past its expert's end are loaded (the next expert's rows,
//   or zeros past M) but not stored. The last K tile of an expert's B likewise may read the next
//   expert's rows; A's columns there are zeros (TMA fills outside the tensor), so they add nothing.
// - LoRA: after the K loop, one more stage holds A2 = XA (or YB) rows (r columns, zero-filled to 64)
//   and the matching B2_e slice, and 1, 2 or 4 MMAs (r <= 16, 32, 64) accumulate it.
// - Epilogue: each consumer warpgroup writes its 64 x 256 part through two swizzled 64 x 64 staging
//   slots with TMA stores that run on under the next tile's MMAs; parts that cross an expert's end fall
//   back to plain stores of that expert's rows.
// - B is K-major (the forward over nn.Linear-layout [E, N, K] weights, the backward over [E, K, N]) or
//   MN-major (the other two cases): the MN-major tile is 4 TMA boxes of 64 columns. B2 is lora_b
//   (K-major) in the forward and lora_a (MN-major) in the backward, whatever W's layout.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include "moe_gemm.hpp"
#include <axengine/cuda/hopper.cuh>

namespace ax::scattermoe {
namespace wg = ax::hopper;
namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4, kThreads = 384;
constexpr uint32_t kABytes = kBM * kBK * 2, kBBytes = kBN * kBK * 2, kStageBytes = kABytes + kBBytes;
// The epilogue's staging of one consumer warpgroup: kOutSlots slots of one 64 x 64 output box each (a
// quarter of its 64 x 256 part; 128-byte swizzled as the output's tensor map reads it).
constexpr int kOutSlots = 2;
constexpr uint32_t kOutBoxBytes = 64 * 64 * 2, kOutBytes = kOutSlots * kOutBoxBytes;
constexpr size_t kSmemBytes = 1024 + size_t(kStages) * kStageBytes + 2 * kOutBytes + 2 * kStages * sizeof(uint64_t);

struct Maps {
  CUtensorMap a, b, a2, b2, out;
};
struct KParams {
  const int64_t* seg;
  const int64_t* row_expert;
  int E, N, k_tiles;
  int64_t M;  // rows of the output's tensor map
  int64_t b_rows_per_expert;  // K-major: N (rows of W_e); MN-major: K (reduction rows of W_e)
  int r;                      // LoRA rank: B2 column (K-major) or row (MN-major) offset e·r
  const __nv_bfloat16* bias;
  int64_t bias_estride;
  __nv_bfloat16* out;
  int64_t ldo;
};

// The tile t of the schedule: expert, first sorted row, rows of the expert, column offset.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
struct Tile {
  int e;
  int64_t row0, end;
  int n0;
};
__device__ __forceinline__ Tile tile_at(int t, const int* tile_start, const int64_t* seg, int E, int n_tiles) {
  int lo = 0, hi = E - 1;  // last expert with tile_start[e] <= t (experts without rows have none)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int local = t - tile_start[lo];
  const int m_tiles = static_cast<int>((seg[lo + 1] - seg[lo] + kBM - 1) / kBM);
  return {lo, seg[lo] + int64_t(local % m_tiles) * kBM, seg[lo + 1], (local / m_tiles) * kBN};
}
#endif

// One k16 slice kk of the stage at (sa: this warpgroup's 64 A rows, sb: the B tile).
template <bool kBKMajor>
__device__ __forceinline__ void mma_k16(float (&acc)[128], uint32_t sa, uint32_t sb, int kk, int scale_d) {
  const uint64_t da = wg::desc_sw128(sa + kk * 32, 16, 1024);
  const uint64_t db = kBKMajor ? wg::desc_sw128(sb + kk * 32, 16, 1024)
                               : wg::desc_sw128(sb + kk * 16 * 128, kBBytes / 4, 1024);
  wg::wgmma_m64n256k16<kBKMajor ? 0 : 1>(acc, da, db, scale_d);
}

// kBKMajor: W's orientation; kB2KMajor: the LoRA operand's (lora_b in the forward, lora_a in the
// backward: independent of how W is stored); kLoraK16: the LoRA step's MMA count (0: no LoRA).
template <bool kBKMajor, bool kB2KMajor, int kLoraK16>
__global__ void __launch_bounds__(kThreads, 1) wgmma_gemm_kernel(const __grid_constant__ Maps maps, KParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* staging = smem + kStages * kStageBytes;  // [2][kOutBytes], one per consumer warpgroup
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + 2 * kOutBytes);
  uint64_t* empty = full + kStages;
  int* tile_start = reinterpret_cast<int*>(empty + kStages);  // [E + 1]
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      wg::mbar_init(&full[s], 1);
      wg::mbar_init(&empty[s], 2);
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
  const int n_tiles = (p.N + kBN - 1) / kBN;
  for (int e = threadIdx.x; e <= p.E; e += kThreads) tile_start[e] *= n_tiles;  // row tiles -> all tiles
  __syncthreads();
  const int total = tile_start[p.E];
  const int k_steps = p.k_tiles + (kLoraK16 > 0 ? 1 : 0);

  if (wg == 0) {  // producer
    wg::setmaxnreg_dec<40>();
    if (threadIdx.x != 0) return;
    int s = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      const Tile tl = tile_at(t, tile_start, p.seg, p.E, n_tiles);
      const int row0 = static_cast<int>(tl.row0);
      for (int kt = 0; kt < k_steps; ++kt) {
        wg::mbar_wait(&empty[s], phase ^ 1);
        wg::mbar_expect_tx(&full[s], kStageBytes);
        uint8_t* sa = smem + s * kStageBytes;
        uint8_t* sb = sa + kABytes;
        const bool lora = kt == p.k_tiles;
        const CUtensorMap* ma = lora ? &maps.a2 : &maps.a;
        const CUtensorMap* mb = lora ? &maps.b2 : &maps.b;
        wg::tma_load_2d(sa, ma, &full[s], lora ? 0 : kt * kBK, row0);
        if (lora ? kB2KMajor : kBKMajor) {  // one 64 x 256 box
          const int brow = lora ? tl.n0 : static_cast<int>(tl.e * p.b_rows_per_expert + tl.n0);
          wg::tma_load_2d(sb, mb, &full[s], lora ? tl.e * p.r : kt * kBK, brow);
        } else {  // MN-major: four 64 x 64 boxes, 8 KB apart (the descriptor's lbo)
          const int brow = lora ? tl.e * p.r : static_cast<int>(tl.e * p.b_rows_per_expert + kt * kBK);
          for (int q = 0; q < kBN / 64; ++q) wg::tma_load_2d(sb + q * (kBBytes / 4), mb, &full[s], tl.n0 + 64 * q, brow);
        }
        if (++s == kStages) s = 0, phase ^= 1;
      }
    }
    return;
  }

  // consumers
  wg::setmaxnreg_inc<232>();
  const int cw = wg - 1;  // rows 64·cw .. 64·cw + 63 of the tile
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  float acc[128];
  int s = 0;
  uint32_t phase = 0;
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const Tile tl = tile_at(t, tile_start, p.seg, p.E, n_tiles);
    // The epilogue's row facts, loaded now so their latency hides under the K loop.
    const int64_t rbase = tl.row0 + cw * 64 + warp * 16 + lane / 4;
    bool keep[2], active[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      keep[h] = rbase + 8 * h < tl.end;
      active[h] = keep[h] && (p.row_expert == nullptr || p.row_expert[rbase + 8 * h] >= 0);
    }
    int prev = -1;
    // One pipeline step: wait for the stage, issue its MMAs, then hand back the previous step's stage
    // (wait_group 1: those MMAs have retired). The LoRA step is separate code, not a branch in the loop:
    // a wgmma under a data-dependent branch makes ptxas serialise every wgmma of the kernel.
    auto step = [&](auto n16, auto kmajor, bool first) {
      wg::mbar_wait(&full[s], phase);
      const uint32_t sa = wg::saddr(smem + s * kStageBytes) + cw * 64 * 128;
      const uint32_t sb = wg::saddr(smem + s * kStageBytes + kABytes);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < decltype(n16)::value; ++kk)
        mma_k16<decltype(kmajor)::value>(acc, sa, sb, kk, !first || kk != 0);
      wg::wgmma_commit();
      wg::wgmma_wait<1>();
      if (prev >= 0 && (threadIdx.x % 128) == 0) wg::mbar_arrive(&empty[prev]);
      prev = s;
      if (++s == kStages) s = 0, phase ^= 1;
    };
    for (int kt = 0; kt < p.k_tiles; ++kt)
      step(std::integral_constant<int, kBK / 16>{}, std::bool_constant<kBKMajor>{}, kt == 0);
    if constexpr (kLoraK16 > 0) step(std::integral_constant<int, kLoraK16>{}, std::bool_constant<kB2KMajor>{}, false);
    wg::wgmma_wait<0>();
    if ((threadIdx.x % 128) == 0) wg::mbar_arrive(&empty[prev]);

    // Epilogue: rows of this expert only; inactive entries (row_expert < 0) are written as zeros.
    auto value = [&](int i, int h, int k) {  // output element (row h, column 8i + 2·(lane%4) + k), final
      float v = acc[4 * i + 2 * h + k];
      const int col = tl.n0 + 8 * i + 2 * (lane % 4) + k;
      if (p.bias != nullptr && col < p.N) v += __bfloat162float(p.bias[tl.e * p.bias_estride + col]);
      return active[h] ? v : 0.f;
    };
    const int64_t wrow0 = tl.row0 + cw * 64;
    if (wrow0 >= tl.end) continue;
    if (wrow0 + 64 <= tl.end || tl.end == p.M) {
      // All 64 rows are this expert's (or past M, where the TMA store clips): the part goes out a
      // quarter (64 columns) at a time through the staging slots, each by one TMA store, which runs on
      // while the next quarter is written and the next tile's MMAs start. Before the barrier that
      // releases a quarter's writes, the lead thread makes sure the next quarter's slot has been read by
      // its previous store. The slots are swizzled like the boxes, so each warp's writes hit 32 banks.
      const bool lead = threadIdx.x % 128 == 0;
      uint8_t* stg = staging + cw * kOutBytes;
      if (lead) wg::bulk_wait_read<kOutSlots - 1>();  // slot 0 is free (the previous tile's stores)
      wg::bar_sync(1 + cw, 128);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint8_t* slot = stg + (q % kOutSlots) * kOutBoxBytes;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp * 16 + lane / 4 + 8 * h;
            const uint32_t off = row * 128 + ((j ^ (row % 8)) * 16) + 4 * (lane % 4);
            *reinterpret_cast<__nv_bfloat162*>(slot + off) =
                __floats2bfloat162_rn(value(8 * q + j, h, 0), value(8 * q + j, h, 1));
          }
        }
        wg::fence_proxy_async();
        if (lead && q < 3) wg::bulk_wait_read<kOutSlots - 2>();  // quarter q + 1's slot is free
        wg::bar_sync(1 + cw, 128);
        if (lead) {
          const int col = tl.n0 + 64 * q;
          if (col < p.N) wg::tma_store_2d(&maps.out, slot, col, static_cast<int>(wrow0));
          wg::bulk_commit();
        }
      }
      continue;
    }
    // The warpgroup's rows cross the expert's end: plain stores of the rows before it.
    const int cbase = tl.n0 + 2 * (lane % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!keep[h]) continue;
      __nv_bfloat16* orow = p.out + (rbase + 8 * h) * p.ldo;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = cbase + 8 * i;
        if (col < p.N) *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(value(i, h, 0), value(i, h, 1));
      }
    }
  }
  if (threadIdx.x % 128 == 0) wg::bulk_wait();  // the stores read shared memory until they complete
#endif
}

using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeFn encode_fn() {
  static EncodeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<EncodeFn>(f);
  }();
  return fn;
}

// A row-major [rows, cols] bf16 matrix (row stride ld elements) read in boxes of box_cols x box_rows.
bool encode(CUtensorMap* m, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_cols, int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * 2};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode_fn()(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool wgmma_gemm_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (major != 9 || minor != 0 || encode_fn() == nullptr) return false;
  // The kernel body exists only in an sm_90a cubin (wgmma, setmaxnreg); a build for plain sm_90 or a
  // PTX JIT from an older target gives an empty kernel, recognisable by its register count (the real one
  // holds 128 fp32 accumulators per consumer thread).
  static const bool compiled = [] {
    cudaFuncAttributes fa{};
    const bool ok = cudaFuncGetAttributes(&fa, wgmma_gemm_kernel<true, true, 1>) == cudaSuccess && fa.numRegs >= 128;
    cudaGetLastError();
    return ok;
  }();
  return compiled;
}

bool launch_wgmma_gemm(const WgmmaGemmArgs& a, cudaStream_t stream) {
  auto ok16 = [](const void* ptr, int64_t ld) { return ptr != nullptr && aligned16(ptr) && ld % 8 == 0; };
  if (a.E <= 0 || a.N <= 0 || a.K <= 0 || a.N % 8 != 0 || a.M <= 0 || a.M >= (int64_t{1} << 31)) return false;
  if (!ok16(a.a, a.lda) || !ok16(a.w, a.ldw) || !ok16(a.out, a.ldo)) return false;
  if (a.r > 0 && (a.r > 64 || a.r % 8 != 0 || !ok16(a.a2, a.r) || !ok16(a.w2, a.ldw2))) return false;
  if (a.bias != nullptr && (a.bias_estride % 2 != 0)) return false;
  const int64_t w_rows = a.w_kmajor ? int64_t(a.E) * a.N : int64_t(a.E) * a.K;
  if (w_rows >= (int64_t{1} << 31)) return false;
  Maps maps{};
  bool ok = encode(&maps.a, a.a, a.M, a.K, a.lda, kBK, kBM);
  if (a.w_kmajor) {
    ok = ok && encode(&maps.b, a.w, w_rows, a.K, a.ldw, kBK, kBN);
  } else {
    ok = ok && encode(&maps.b, a.w, w_rows, a.N, a.ldw, 64, kBK);
  }
  if (a.r > 0) {
    ok = ok && encode(&maps.a2, a.a2, a.M, a.r, a.r, kBK, kBM);
    // K-major B2: lora_b [N, r·E] (B_e(j, n) = lora_b[n, e·r + j]); MN-major: lora_a [r·E, N].
    ok = ok && (a.w2_kmajor ? encode(&maps.b2, a.w2, a.N, int64_t(a.r) * a.E, a.ldw2, kBK, kBN)
                           : encode(&maps.b2, a.w2, int64_t(a.r) * a.E, a.N, a.ldw2, 64, kBK));
  } else {
    maps.a2 = maps.a;
    maps.b2 = maps.b;
  }
  ok = ok && encode(&maps.out, a.out, a.M, a.N, a.ldo, 64, 64);
  if (!ok) return false;
  KParams p{a.seg, a.row_expert, a.E, a.N, static_cast<int>((a.K + kBK - 1) / kBK), a.M,
            a.w_kmajor ? a.N : a.K, a.r, static_cast<const __nv_bfloat16*>(a.bias), a.bias_estride,
            static_cast<__nv_bfloat16*>(a.out), a.ldo};
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const size_t smem = kSmemBytes + sizeof(int) * (a.E + 1);
  auto launch = [&](auto kernel) {
    // Opt in to the large shared memory once per instantiation (the attribute is per function).
    static std::mutex mu;
    static std::vector<const void*> done;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (std::find(done.begin(), done.end(), reinterpret_cast<const void*>(kernel)) == done.end()) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448);
        done.push_back(reinterpret_cast<const void*>(kernel));
      }
    }
    kernel<<<sms, kThreads, smem, stream>>>(maps, p);
  };
  if (smem > 232448) return false;
  // The LoRA step's MMA count: r = 8, 16 -> 1; 24, 32 -> 2; up to 64 -> 4 (the zero-filled columns
  // past r add nothing).
  const int k16 = a.r == 0 ? 0 : a.r <= 16 ? 1 : a.r <= 32 ? 2 : 4;
  auto pick = [&](auto kmajor, auto k2major) {
    constexpr bool km = decltype(kmajor)::value, k2 = decltype(k2major)::value;
    switch (k16) {
      case 0: launch(wgmma_gemm_kernel<km, k2, 0>); break;
      case 1: launch(wgmma_gemm_kernel<km, k2, 1>); break;
      case 2: launch(wgmma_gemm_kernel<km, k2, 2>); break;
      default: launch(wgmma_gemm_kernel<km, k2, 4>); break;
    }
  };
  if (a.w_kmajor) {
    if (a.w2_kmajor) pick(std::true_type{}, std::true_type{}); else pick(std::true_type{}, std::false_type{});
  } else {
    if (a.w2_kmajor) pick(std::false_type{}, std::true_type{}); else pick(std::false_type{}, std::false_type{});
  }
  return true;
}

}  // namespace ax::scattermoe
