// What every fused_attn backend's glue shares: the current stream and SM count of a tensor's device, the
// launch check, and the options the engine hands over.
#pragma once
#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include <memory>

#include "options.hpp"

namespace ax::fused_attn {

// ATen's current stream on t's device (the kernels queue there, after whatever ATen queued).
cudaStream_t stream_of(const at::Tensor& t);
int sm_count(const at::Tensor& t);
// Throws RuntimeError "<op>[fused_attn]: <what> failed: <CUDA error>" when the last launch failed.
void check_launch(const char* op, const char* what);
// A tensor of the op's arguments must live on a CUDA device.
void require_cuda(const at::Tensor& t, const char* op, const char* arg);

// The backends' shared state: the options, defaults until the engine hands the bound ones over.
struct Context {
  Options options;
};

}  // namespace ax::fused_attn
