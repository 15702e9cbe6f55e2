// Routing preparation and the dtype / weight-format switch of the launch interface.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "element.cuh"
#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
// Per dtype and tile (moe_gemm_*.cu): launch, or with occ return the resident blocks per SM.
int grouped_bf16(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ);
int grouped_fp16(int tile, const GroupedGemmArgs& a, cudaStream_t s, bool occ);
int gram_bf16(int tile, const GramArgs& a, cudaStream_t s, bool occ);
int gram_fp16(int tile, const GramArgs& a, cudaStream_t s, bool occ);
int grouped_idx64(const GroupedGemmArgs& a, cudaStream_t s, bool occ);  // 128x128, both dtypes
int gram_idx64(const GramArgs& a, cudaStream_t s, bool occ);            // gram128x16, both dtypes
// Packed W (moe_gemm_<format>.cu): a fixed tile per shape, both dtypes.
void grouped_gemm_nf4(const GroupedGemmArgs& a, cudaStream_t s);
void grouped_gemm_mxfp4(const GroupedGemmArgs& a, cudaStream_t s);
void grouped_gemm_nvfp4(const GroupedGemmArgs& a, cudaStream_t s);

// One block scans the per-expert row counts into segment starts and M-tile starts (chunks of 1024
// experts, carrying the running totals), so the GEMM grid can be sized on the host from an upper
// bound without reading the routing back (no host synchronisation, CUDA-graph safe).
// tile_start holds two arrays of E+1: 128-row tiles, then 64-row tiles (the tile configurations' BM).
__global__ void prep_kernel(const int64_t* ends, int E, int64_t first, int64_t* seg, int32_t* tile_start) {
  __shared__ int64_t rows[1024];
  __shared__ int32_t tiles[1024];
  __shared__ int32_t tiles64[1024];
  __shared__ int64_t carry_rows;
  __shared__ int32_t carry_tiles, carry_tiles64;
  int32_t* tile_start64 = tile_start + E + 1;
  const int t = threadIdx.x;
  if (t == 0) {
    carry_rows = first;
    carry_tiles = 0;
    carry_tiles64 = 0;
    seg[0] = first;
    tile_start[0] = 0;
    tile_start64[0] = 0;
  }
  __syncthreads();
  for (int base = 0; base < E; base += 1024) {
    const int e = base + t;
    int64_t cnt = 0;
    if (e < E) {
      const int64_t begin = e == 0 ? first : ends[e - 1];
      cnt = ends[e] - begin;
      if (cnt < 0) cnt = 0;  // malformed offsets are rejected by the glue; never size a negative tile
    }
    rows[t] = cnt;
    tiles[t] = static_cast<int32_t>((cnt + 127) / 128);
    tiles64[t] = static_cast<int32_t>((cnt + 63) / 64);
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) {  // Hillis-Steele inclusive scan
      int64_t r = t >= off ? rows[t - off] : 0;
      int32_t q = t >= off ? tiles[t - off] : 0;
      int32_t q64 = t >= off ? tiles64[t - off] : 0;
      __syncthreads();
      rows[t] += r;
      tiles[t] += q;
      tiles64[t] += q64;
      __syncthreads();
    }
    if (e < E) {
      seg[e + 1] = carry_rows + rows[t];
      tile_start[e + 1] = carry_tiles + tiles[t];
      tile_start64[e + 1] = carry_tiles64 + tiles64[t];
    }
    __syncthreads();
    if (t == 1023) {
      carry_rows += rows[t];
      carry_tiles += tiles[t];
      carry_tiles64 += tiles64[t];
    }
    __syncthreads();
  }
}

// Rows from *first up to M, one block per row at a time (usually there are none: all entries active).
__global__ void zero_rows_kernel(uint16_t* c, int64_t ldc, int64_t n, int64_t M, const int64_t* first) {
  const int64_t r0 = *first < 0 ? 0 : *first;
  for (int64_t r = r0 + blockIdx.x; r < M; r += gridDim.x)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) c[r * ldc + j] = 0;  // +0.0 in bf16 and fp16
}
}  // namespace detail

void launch_zero_rows_from(void* c, int64_t ldc, int64_t n, int64_t M, const int64_t* first_row, cudaStream_t stream) {
  if (M <= 0 || n <= 0) return;
  const unsigned blocks = static_cast<unsigned>(M < 512 ? M : 512);
  detail::zero_rows_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint16_t*>(c), ldc, n, M, first_row);
}

void launch_prep(const int64_t* ends, int E, int64_t first, int64_t* seg, int32_t* tile_start, cudaStream_t stream) {
  detail::prep_kernel<<<1, 1024, 0, stream>>>(ends, E, first, seg, tile_start);
}

TileVariant grouped_variant(const GroupedGemmArgs& a) {
  TileVariant v;
  v.family = TileFamily::grouped;
  v.bf16 = a.dtype == DType::bf16;
  // Row offsets of A, A2, C and D (weight offsets stay 64-bit in both variants: once per block).
  v.idx64 = needs_idx64(a.M, {a.lda, a.K2 > 0 ? a.lda2 : 0, a.ldc, a.d ? a.ldd : 0});
  v.mixed = a.K2 > 0 && a.w_kmajor != a.w2_kmajor;
  return v;
}

TileVariant gram_variant(const GramArgs& a) {
  TileVariant v;
  v.family = TileFamily::gram;
  v.bf16 = a.dtype == DType::bf16;
  v.idx64 = needs_idx64(a.M, {a.ldp, a.ldq});
  return v;
}

int thin_split_k(const GroupedGemmArgs& a, int sms) {
  if (a.K2 != 0 || a.bias || a.d || a.wq.format != WeightFormat::dense) return 1;
  return thin_split_k(a.M, a.E, a.N, a.K, sms);
}

namespace detail {
namespace {
// C[crow(m), n] = Σ_s P[s][m][n] over the sorted rows of the experts (m < seg[E]); inactive rows: zeros,
// or skipped when scattered (as the GEMM epilogue).
template <class T>
__global__ void split_k_reduce_kernel(const GroupedGemmArgs a) {
  const int64_t total = a.M * a.N, stride = a.M * a.N;
  const int64_t rows = a.seg[a.E];
  T* C = static_cast<T*>(a.c);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / a.N;
    if (m >= rows) break;  // i grows: every later element is past the last expert too
    const int n = static_cast<int>(i - m * a.N);
    const bool active = !(a.row_expert && a.row_expert[m] < 0);
    if (!active && a.c_idx) continue;
    float v = 0.f;
    for (int s = 0; s < a.splits; ++s) v += a.partial[s * stride + i];
    C[(a.c_idx ? a.c_idx[m] : m) * a.ldc + n] = from_f<T>(active ? v : 0.f);
  }
}
}  // namespace
}  // namespace detail

namespace {
int run_grouped(const GroupedGemmArgs& a, int tile, cudaStream_t s, bool occ) {
  const TileVariant v = grouped_variant(a);
  if (!tile_compiled(tile, v)) {
    if (occ) return 0;
    tile = fallback_tile(v, a.N);
  }
  if (!occ && a.splits > 1 && (a.partial == nullptr || a.K2 != 0 || a.bias || a.d || a.wq.format != WeightFormat::dense))
    throw std::runtime_error("scattermoe: split-K needs a workspace and a plain product (no LoRA term, bias, addend)");
  int r = 0;
  if (v.idx64) r = detail::grouped_idx64(a, s, occ);  // tile_compiled: only kTile128x128 has it
  else r = v.bf16 ? detail::grouped_bf16(tile, a, s, occ) : detail::grouped_fp16(tile, a, s, occ);
  if (!occ && a.splits > 1 && a.M > 0 && a.N > 0) {
    const int64_t blocks = std::min<int64_t>((a.M * a.N + 255) / 256, 65535);
    if (v.bf16) detail::split_k_reduce_kernel<__nv_bfloat16><<<static_cast<unsigned>(blocks), 256, 0, s>>>(a);
    else detail::split_k_reduce_kernel<__half><<<static_cast<unsigned>(blocks), 256, 0, s>>>(a);
  }
  return r;
}
int run_gram(const GramArgs& a, int tile, cudaStream_t s, bool occ) {
  const TileVariant v = gram_variant(a);
  if (!tile_compiled(tile, v)) {
    if (occ) return 0;
    tile = fallback_tile(v, a.J);
  }
  if (!occ && a.E > 65535) throw std::runtime_error("scattermoe: more than 65535 experts (grid limit of the Gram kernels)");
  if (v.idx64) return detail::gram_idx64(a, s, occ);  // only kTileGram128x16 has it
  return v.bf16 ? detail::gram_bf16(tile, a, s, occ) : detail::gram_fp16(tile, a, s, occ);
}
}  // namespace

void grouped_gemm(const GroupedGemmArgs& a, cudaStream_t s) {
  switch (a.wq.format) {
    case WeightFormat::nf4: return detail::grouped_gemm_nf4(a, s);
    case WeightFormat::mxfp4: return detail::grouped_gemm_mxfp4(a, s);
    case WeightFormat::nvfp4: return detail::grouped_gemm_nvfp4(a, s);
    case WeightFormat::dense: break;
  }
  run_grouped(a, a.tile, s, false);
}
int grouped_occupancy(const GroupedGemmArgs& a, int tile) { return run_grouped(a, tile, nullptr, true); }
void gram_gemm(const GramArgs& a, cudaStream_t s) { run_gram(a, a.tile, s, false); }
int gram_occupancy(const GramArgs& a, int tile) { return run_gram(a, tile, nullptr, true); }

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("scattermoe: ") + what + " failed: " + cudaGetErrorString(err));
}

}  // namespace ax::scattermoe
