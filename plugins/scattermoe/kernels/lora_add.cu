// The split path's "LoRA add" (src/split_path.cpp): C[crow(m), n] = alpha · XA[m, :] · B_e[:, n] + bias_e[n]
// + beta · D[m, n], where D is the base product _grouped_mm wrote and the rank r is small. It is a
// memory-bound pass over two [M, N] matrices, not a GEMM: run as the GEMM kernel (a 128x128 tile with a
// single k-tile of r) it moved ~0.8 TB/s. Here every thread owns 8 adjacent columns (16-byte loads and
// stores, whole rows per warp), XA rows and the expert's B tile sit in shared memory as fp32, and each
// output takes r FMAs. Same row semantics as the grouped GEMM (moe_gemm.hpp): inactive rows read
// nothing and are written as zeros (grouped output) or skipped (scattered output); the element a thread
// writes is the one it read from D, so C may alias D when rows are not scattered.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
namespace {

// A block: 128 rows (one 128-row tile of an expert segment) x 256 columns; a warp owns rows warp, warp + 8,
// ... and reads the D vectors of 8 of them before computing any (8 loads in flight per thread: the pass
// is latency-bound otherwise).
constexpr int kBM = 128, kBN = 256, kThreadsLA = 256, kWarpsLA = kThreadsLA / 32, kBatch = 8, kMaxRank = 64;

template <class T>
__device__ __forceinline__ float to_float(T v) { return static_cast<float>(v); }

template <class T>
__device__ __forceinline__ void unpack8(const uint4& u, float* out) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = static_cast<float>(h[i]);
}
template <class T>
__device__ __forceinline__ uint4 pack8(const float* v) {
  uint4 u;
  T* h = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = static_cast<T>(v[i]);
  return u;
}

template <class T>
__global__ void __launch_bounds__(kThreadsLA) lora_add_kernel(const GroupedGemmArgs a) {
  extern __shared__ float smem[];
  const int r = a.K;
  float* sB = smem;            // [r][kBN]: B_e(j, n0 + c)
  float* sX = smem + r * kBN;  // [kBM][r]: XA rows of the tile (zero for inactive rows)

  // 128-row tiles of the expert segments (launch_prep's first tile_start array).
  const int32_t* ts = a.tile_start;
  const int64_t tile = blockIdx.y;
  if (tile >= ts[a.E]) return;
  int lo = 0, hi = a.E - 1;  // largest e with ts[e] <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ts[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  const int e = lo;
  const int64_t m0 = a.seg[e] + (tile - ts[e]) * kBM;
  const int64_t m_end = min(a.seg[e + 1], m0 + kBM);
  const int n0 = blockIdx.x * kBN;

  const T* W = static_cast<const T*>(a.w) + e * a.w_estride;
#pragma unroll 4
  for (int i = threadIdx.x; i < r * kBN; i += kThreadsLA) {
    // k-major B (lora_b [N, r·E]): j runs fastest so a warp reads whole r-element runs of one n.
    const int j = a.w_kmajor ? i % r : i / kBN, c = a.w_kmajor ? i / r : i % kBN;
    const int n = n0 + c;
    float v = 0.f;
    if (n < a.N) v = to_float(a.w_kmajor ? W[static_cast<int64_t>(n) * a.ldw + j] : W[static_cast<int64_t>(j) * a.ldw + n]);
    sB[j * kBN + c] = v;
  }
  const T* A = static_cast<const T*>(a.a);
#pragma unroll 4
  for (int i = threadIdx.x; i < kBM * r; i += kThreadsLA) {
    const int64_t m = m0 + i / r;
    float v = 0.f;
    if (m < m_end && !(a.row_expert && a.row_expert[m] < 0)) v = to_float(A[m * a.lda + i % r]);
    sX[i] = v;
  }
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = lane * 8, n = n0 + c0;
  if (n >= a.N) return;  // N % 8 == 0 (launcher): a chunk is all in or all out
  float bias[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (a.bias) {
    const T* b = static_cast<const T*>(a.bias) + e * a.bias_estride + n;
#pragma unroll
    for (int i = 0; i < 8; ++i) bias[i] = to_float(b[i]);
  }
  const T* D = static_cast<const T*>(a.d);
  T* C = static_cast<T*>(a.c);
  for (int b = 0; b < kBM / kWarpsLA; b += kBatch) {
    uint4 dv[kBatch];
    bool act[kBatch];
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int64_t m = m0 + warp + (b + q) * kWarpsLA;
      act[q] = m < m_end && !(a.row_expert && a.row_expert[m] < 0);
      dv[q] = (D && act[q]) ? *reinterpret_cast<const uint4*>(D + m * a.ldd + n) : make_uint4(0, 0, 0, 0);
    }
    // j outer, rows inner: each B vector read from shared memory serves the batch's 8 rows (read per
    // row, the B reads alone saturated shared-memory bandwidth). Rows outside the segment or inactive
    // have zero XA rows, so their sums stay zero.
    float acc[kBatch][8];
#pragma unroll
    for (int q = 0; q < kBatch; ++q)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[q][i] = 0.f;
    for (int j = 0; j < r; ++j) {
      const float4 b0 = *reinterpret_cast<const float4*>(sB + j * kBN + c0);
      const float4 b1 = *reinterpret_cast<const float4*>(sB + j * kBN + c0 + 4);
#pragma unroll
      for (int q = 0; q < kBatch; ++q) {
        const float x = sX[(warp + (b + q) * kWarpsLA) * r + j];
        acc[q][0] += x * b0.x; acc[q][1] += x * b0.y; acc[q][2] += x * b0.z; acc[q][3] += x * b0.w;
        acc[q][4] += x * b1.x; acc[q][5] += x * b1.y; acc[q][6] += x * b1.z; acc[q][7] += x * b1.w;
      }
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      const int64_t m = m0 + warp + (b + q) * kWarpsLA;
      if (m >= m_end || (!act[q] && a.c_idx)) continue;
      float out[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (act[q]) {
        float d[8];
        unpack8<T>(dv[q], d);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = a.alpha * acc[q][i] + bias[i] + a.beta * d[i];
      }
      const int64_t crow = a.c_idx ? a.c_idx[m] : m;
      *reinterpret_cast<uint4*>(C + crow * a.ldc + n) = pack8<T>(out);
    }
  }
}

}  // namespace
}  // namespace detail

bool launch_lora_add(const GroupedGemmArgs& a, cudaStream_t stream) {
  // Only the split path's shape of call: plain rank-r A in sorted order, no second product, no row scale,
  // dense B, 16-byte vectors on C and D.
  if (a.K < 0 || a.K > detail::kMaxRank || a.K2 != 0 || a.row_scale || a.a_idx || a.wq.format != WeightFormat::dense)
    return false;
  if (a.N % 8 != 0 || a.ldc % 8 != 0 || !aligned16(a.c)) return false;
  if (a.d && (a.ldd % 8 != 0 || !aligned16(a.d))) return false;
  if (a.E <= 0 || a.M <= 0 || a.N <= 0) return true;  // nothing to write
  const int64_t max_tiles = (a.M + detail::kBM - 1) / detail::kBM + a.E;
  // Column tiles run fastest: the blocks in flight cover whole rows of D and C (long DRAM bursts) rather
  // than one 512-byte strip of many rows.
  if (max_tiles > 65535) return false;  // gridDim.y limit: the grouped kernel takes such calls
  const dim3 grid(static_cast<unsigned>((a.N + detail::kBN - 1) / detail::kBN), static_cast<unsigned>(max_tiles));
  const int smem = static_cast<int>((a.K * detail::kBN + detail::kBM * a.K) * sizeof(float));
  if (a.dtype == DType::bf16) {
    auto k = detail::lora_add_kernel<__nv_bfloat16>;
    if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k<<<grid, detail::kThreadsLA, smem, stream>>>(a);
  } else {
    auto k = detail::lora_add_kernel<__half>;
    if (smem > 48 * 1024) cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k<<<grid, detail::kThreadsLA, smem, stream>>>(a);
  }
  return true;
}

}  // namespace ax::scattermoe
