// See glue.hpp.
#include "glue.hpp"

#include <c10/cuda/CUDAStream.h>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

namespace ax::nf4 {

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw RuntimeError(str("nf4: ", what, " failed: ", cudaGetErrorString(err)));
}

void fail(const char* fn, const char* arg, const std::string& why) {
  throw UsageError(str(fn, "[nf4]: ", arg, ": ", why));
}

void require_cuda(const at::Tensor& t, const char* fn, const char* arg) {
  if (!t.defined()) fail(fn, arg, "is required but was not given");
  if (!t.is_cuda()) fail(fn, arg, str("needs a CUDA tensor, got ", t.device().str()));
}

DType kernel_dtype(at::ScalarType t, const char* fn, const char* arg) {
  switch (t) {
    case at::kFloat: return DType::fp32;
    case at::kBFloat16: return DType::bf16;
    case at::kHalf: return DType::fp16;
    default: fail(fn, arg, str("must be fp32, bf16 or fp16, got ", c10::toString(t)));
  }
}

}  // namespace ax::nf4
