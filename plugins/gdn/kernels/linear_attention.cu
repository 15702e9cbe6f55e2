// The gdn kernels on the GPU: kernels/chunk_math.cuh's two scans with one CUDA thread block each (sequence,
// head, column tile), 256 threads: operands staged in shared memory with cp.async, fp32 register micro-tiles,
// sm_80+ (docs/plugins/gdn.md).
#include <cuda_runtime.h>

#include <string>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "kernels.hpp"

namespace ax::gdn {
namespace {

constexpr int kThreads = 256;

struct DeviceBlock {
  __device__ int tid() const { return static_cast<int>(threadIdx.x); }
  __device__ int n() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() const { __syncthreads(); }
};

// One block per (sequence, head, column tile), as chunk_math.cuh's scans index them.
template <bool kForward>
__global__ void __launch_bounds__(kThreads) scan_kernel(Params p) {
  extern __shared__ float smem[];
  const int tiles = col_tiles(p);
  const int64_t b = blockIdx.x / (p.H * tiles);
  const int rest = static_cast<int>(blockIdx.x % (p.H * tiles));
  if constexpr (kForward)
    scan_forward(DeviceBlock{}, p, b, rest / tiles, rest % tiles, smem);
  else
    scan_backward(DeviceBlock{}, p, b, rest / tiles, rest % tiles, smem);
}

void check(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw RuntimeError(std::string("gdn: ") + what + " failed: " + cudaGetErrorString(err));
}

// Launches `kernel` over `blocks` blocks with `floats` of dynamic shared memory (opting in above 48 KiB;
// the attribute is a property of the function, not a stream operation, so capture allows it).
template <class Kernel>
void launch(Kernel kernel, const char* what, int64_t blocks, int64_t smem_bytes, const Params& p, void* stream) {
  if (blocks == 0) return;
  const size_t bytes = static_cast<size_t>(smem_bytes);
  if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  kernel<<<static_cast<unsigned>(blocks), kThreads, bytes, static_cast<cudaStream_t>(stream)>>>(p);
  check(what);
}

void scan_fwd(const Params& p, void* s) {
  launch(scan_kernel<true>, "scan_forward", p.N * p.H * col_tiles(p), scan_smem_bytes(p.Dk, false, p.overlap), p, s);
}
void scan_bwd(const Params& p, void* s) {
  launch(scan_kernel<false>, "scan_backward", p.N * p.H * col_tiles(p), scan_smem_bytes(p.Dk, true, p.overlap), p, s);
}

int64_t smem_limit(int device) {
  int bytes = 0;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    throw RuntimeError(str("gdn: cannot read the shared memory limit of CUDA device ", device));
  return bytes;
}

}  // namespace

const Kernels& cuda_kernels() {
  static const Kernels k{"cuda", scan_fwd, scan_bwd, smem_limit};
  return k;
}

}  // namespace ax::gdn
