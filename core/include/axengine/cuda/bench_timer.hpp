// The event timer of the plugins' GPU benchmarks (plugins/*/bench): a CUDA event pair around each call on
// the current stream, every pair recorded before one synchronisation (a sync per call would let the GPU
// idle between calls and time the launch latency too), and the median of `iters` calls after `warmup`.
// Host code only; include it from a target that links the CUDA runtime.
#pragma once
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace ax::cuda {

inline double median_event_ms(const std::function<void()>& f, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) f();
  cudaStream_t s = at::cuda::getCurrentCUDAStream().stream();
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) cudaEventCreate(&e);
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(ev[2 * i], s);
    f();
    cudaEventRecord(ev[2 * i + 1], s);
  }
  cudaStreamSynchronize(s);
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float v = 0;
    cudaEventElapsedTime(&v, ev[2 * i], ev[2 * i + 1]);
    ms[i] = v;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[iters / 2];
}

}  // namespace ax::cuda
