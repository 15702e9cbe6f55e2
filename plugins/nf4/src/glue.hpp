// What the nf4 glue shares: the current stream of a tensor's device, the launch check, argument checks
// that name the entry point, and the kernels' dtype of an ATen scalar type.
#pragma once
#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include "../kernels/kernels.hpp"

namespace ax::nf4 {

// ATen's current stream on t's device (the kernels queue there, after whatever ATen queued).
cudaStream_t stream_of(const at::Tensor& t);
// Throws RuntimeError "nf4: <what> failed: <CUDA error>" when the last launch failed.
void check_launch(const char* what);
// Throws UsageError "<fn>[nf4]: <arg>: <why>".
[[noreturn]] void fail(const char* fn, const char* arg, const std::string& why);
void require_cuda(const at::Tensor& t, const char* fn, const char* arg);
// fp32 / bf16 / fp16, else UsageError.
DType kernel_dtype(at::ScalarType t, const char* fn, const char* arg);

}  // namespace ax::nf4
