// Routing preparation and the dtype / weight-format switch of the launch interface.
#include <stdexcept>
#include <string>

#include "moe_gemm.hpp"

namespace ax::scattermoe {
namespace detail {
void grouped_gemm_bf16(const GroupedGemmArgs& a, cudaStream_t s);
void grouped_gemm_fp16(const GroupedGemmArgs& a, cudaStream_t s);
void gram_gemm_bf16(const GramArgs& a, cudaStream_t s);
void gram_gemm_fp16(const GramArgs& a, cudaStream_t s);
void grouped_gemm_nf4(const GroupedGemmArgs& a, cudaStream_t s);
void grouped_gemm_mxfp4(const GroupedGemmArgs& a, cudaStream_t s);
void grouped_gemm_nvfp4(const GroupedGemmArgs& a, cudaStream_t s);

// One block scans the per-expert row counts into segment starts and M-tile starts (chunks of 1024
// experts, carrying the running totals), so the GEMM grid can be sized on the host from an upper
// bound without reading the routing back (no host synchronisation, CUDA-graph safe).
__global__ void prep_kernel(const int64_t* ends, int E, int64_t first, int64_t* seg, int32_t* tile_start) {
  __shared__ int64_t rows[1024];
  __shared__ int32_t tiles[1024];
  __shared__ int64_t carry_rows;
  __shared__ int32_t carry_tiles;
  const int t = threadIdx.x;
  if (t == 0) {
    carry_rows = first;
    carry_tiles = 0;
    seg[0] = first;
    tile_start[0] = 0;
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
    tiles[t] = static_cast<int32_t>((cnt + kTileM - 1) / kTileM);
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) {  // Hillis-Steele inclusive scan
      int64_t r = t >= off ? rows[t - off] : 0;
      int32_t q = t >= off ? tiles[t - off] : 0;
      __syncthreads();
      rows[t] += r;
      tiles[t] += q;
      __syncthreads();
    }
    if (e < E) {
      seg[e + 1] = carry_rows + rows[t];
      tile_start[e + 1] = carry_tiles + tiles[t];
    }
    __syncthreads();
    if (t == 1023) {
      carry_rows += rows[t];
      carry_tiles += tiles[t];
    }
    __syncthreads();
  }
}
}  // namespace detail

void launch_prep(const int64_t* ends, int E, int64_t first, int64_t* seg, int32_t* tile_start, cudaStream_t stream) {
  detail::prep_kernel<<<1, 1024, 0, stream>>>(ends, E, first, seg, tile_start);
}

void grouped_gemm(const GroupedGemmArgs& a, cudaStream_t s) {
  switch (a.wq.format) {
    case WeightFormat::nf4: return detail::grouped_gemm_nf4(a, s);
    case WeightFormat::mxfp4: return detail::grouped_gemm_mxfp4(a, s);
    case WeightFormat::nvfp4: return detail::grouped_gemm_nvfp4(a, s);
    case WeightFormat::dense: break;
  }
  if (a.dtype == DType::bf16) detail::grouped_gemm_bf16(a, s);
  else detail::grouped_gemm_fp16(a, s);
}

void gram_gemm(const GramArgs& a, cudaStream_t s) {
  if (a.dtype == DType::bf16) detail::gram_gemm_bf16(a, s);
  else detail::gram_gemm_fp16(a, s);
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("scattermoe: ") + what + " failed: " + cudaGetErrorString(err));
}

}  // namespace ax::scattermoe
