// The gdn kernels on the GPU: kernels/chunk_math.cuh's block bodies with one CUDA thread block each.
// Plain fp32 FMA loops over shared and global memory: the correct sm_80+ path (docs/plugins/gdn.md).
#include <cuda_runtime.h>

#include <string>

#include <axengine/error.hpp>

#include "kernels.hpp"

namespace ax::gdn {
namespace {

constexpr int kThreads = 256;

struct DeviceBlock {
  __device__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ int n() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() const { __syncthreads(); }
};

__global__ void __launch_bounds__(kThreads) ut_transform_kernel(Params p) {
  extern __shared__ float smem[];
  ut_transform(DeviceBlock{}, p, blockIdx.x / p.H, static_cast<int>(blockIdx.x % p.H), smem);
}

__global__ void __launch_bounds__(kThreads) scan_forward_kernel(Params p) {
  extern __shared__ float smem[];
  const int tiles = col_tiles(p);
  const int64_t b = blockIdx.x / (p.H * tiles);
  const int rest = static_cast<int>(blockIdx.x % (p.H * tiles));
  scan_forward(DeviceBlock{}, p, b, rest / tiles, rest % tiles, smem);
}

__global__ void __launch_bounds__(kThreads) output_forward_kernel(Params p) {
  output_forward(DeviceBlock{}, p, blockIdx.x / p.H, static_cast<int>(blockIdx.x % p.H));
}

__global__ void __launch_bounds__(kThreads) scan_backward_kernel(Params p) {
  extern __shared__ float smem[];
  const int tiles = col_tiles(p);
  const int64_t b = blockIdx.x / (p.H * tiles);
  const int rest = static_cast<int>(blockIdx.x % (p.H * tiles));
  scan_backward(DeviceBlock{}, p, b, rest / tiles, rest % tiles, smem);
}

__global__ void __launch_bounds__(kThreads) chunk_backward_kernel(Params p) {
  extern __shared__ float smem[];
  chunk_backward(DeviceBlock{}, p, blockIdx.x / p.H, static_cast<int>(blockIdx.x % p.H), smem);
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw RuntimeError(std::string("gdn: ") + what + " failed: " + cudaGetErrorString(err));
}

// Launches `kernel` over `blocks` blocks with `floats` of dynamic shared memory (opting in above 48 KiB;
// the attribute is a property of the function, not a stream operation, so capture allows it).
template <class Kernel>
void launch(Kernel kernel, const char* what, int64_t blocks, int64_t floats, const Params& p, void* stream) {
  if (blocks == 0) return;
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  kernel<<<static_cast<unsigned>(blocks), kThreads, bytes, static_cast<cudaStream_t>(stream)>>>(p);
  check(what);
}

void ut(const Params& p, void* s) { launch(ut_transform_kernel, "ut_transform", p.NC * p.H, ut_transform_smem(p), p, s); }
void scan_fwd(const Params& p, void* s) {
  launch(scan_forward_kernel, "scan_forward", p.N * p.H * col_tiles(p), scan_smem(p), p, s);
}
void out_fwd(const Params& p, void* s) { launch(output_forward_kernel, "output_forward", p.NC * p.H, 0, p, s); }
void scan_bwd(const Params& p, void* s) {
  launch(scan_backward_kernel, "scan_backward", p.N * p.H * col_tiles(p), scan_smem(p), p, s);
}
void chunk_bwd(const Params& p, void* s) {
  launch(chunk_backward_kernel, "chunk_backward", p.NC * p.H, chunk_backward_smem(p), p, s);
}

}  // namespace

const Kernels& cuda_kernels() {
  static const Kernels k{"cuda", ut, scan_fwd, out_fwd, scan_bwd, chunk_bwd};
  return k;
}

}  // namespace ax::gdn
