// The second half of every deterministic weight gradient (norm_rope, rms_norm): the per-block fp32
// partials [blocks, cols] summed over blocks in ascending order, then rounded once to the weight's dtype.
// A block covers 32 columns (coalesced reads) with 16 row groups; group j sums blocks j, j + 16, ... and
// group 0 adds the 16 group sums in order. No atomics: the same partials always give the same bits.
#include "common.cuh"

namespace ax::fused_attn {
namespace {

using namespace dev;

constexpr int kCols = 32, kGroups = 16;

template <class T>
__global__ void __launch_bounds__(kCols* kGroups)
    reduce_partials(const float* partial, int blocks, int64_t cols, View1 out) {
  __shared__ float sums[kGroups][kCols];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  float s = 0.f;
  if (col < cols)
    for (int b = threadIdx.y; b < blocks; b += kGroups) s += partial[static_cast<int64_t>(b) * cols + col];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.f;
    for (int j = 0; j < kGroups; ++j) total += sums[j][threadIdx.x];
    static_cast<T*>(out.p)[col * out.s] = from_f<T>(total);
  }
}

}  // namespace

void launch_reduce_partials(const float* partial, int blocks, int64_t cols, DType dtype, View1 out,
                            cudaStream_t stream) {
  if (cols == 0) return;
  const auto grid = static_cast<unsigned>((cols + kCols - 1) / kCols);
  const dim3 block(kCols, kGroups);
  with_element_type(dtype, [&](auto zero) {
    reduce_partials<decltype(zero)><<<grid, block, 0, stream>>>(partial, blocks, cols, out);
  });
}

}  // namespace ax::fused_attn
