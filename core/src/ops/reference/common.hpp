// Helpers shared by the reference backends.
#pragma once
#include <ATen/ATen.h>

namespace ax::ops::ref {

// The references compute in fp32 (fp64 when given fp64) whatever the input dtype, and round each output
// once: they are the ground truth a bf16/fp16 backend is measured against.
inline at::ScalarType compute_type(at::ScalarType input) { return input == at::kDouble ? at::kDouble : at::kFloat; }

// Returns `value` converted to `like`'s dtype, written into `out` when the caller preallocated one.
inline at::Tensor emit(const at::Tensor& value, at::ScalarType dtype, const at::Tensor& out) {
  if (!out.defined()) return value.to(dtype);
  out.copy_(value);
  return out;
}

}  // namespace ax::ops::ref
