// See glue.hpp.
#include "glue.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

namespace ax::fused_attn {

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

int sm_count(const at::Tensor& t) { return at::cuda::getDeviceProperties(t.device().index())->multiProcessorCount; }

void check_launch(const char* op, const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw RuntimeError(str(op, "[fused_attn]: ", what, " failed: ", cudaGetErrorString(err)));
}

void require_cuda(const at::Tensor& t, const char* op, const char* arg) {
  if (!t.is_cuda()) throw UsageError(str(op, "[fused_attn]: ", arg, ": needs a CUDA tensor, got ", t.device().str()));
}

}  // namespace ax::fused_attn
