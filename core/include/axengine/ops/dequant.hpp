// dequant — nf4 (incl. double-quantised absmax), mxfp4 and nvfp4 weights to fp32/bf16/fp16, whole or
// only selected experts. Contract and the bit-level formats: docs/ops/dequant.md.
#pragma once
#include <ATen/core/Tensor.h>

#include "axengine/kernel_op.hpp"
#include "axengine/ops/quant_formats.hpp"

namespace ax::ops {

struct DequantArgs {
  WeightTensor weight;  // nf4 / mxfp4 / nvfp4 (dense is rejected: nothing to do)
  at::ScalarType dtype = at::kBFloat16;  // output dtype: fp32, bf16, fp16
  // Optional int64 [S] expert ids (the selective form): the result is weight[experts] of shape
  // [S, shape[1:]...], in the order given (repeats allowed). Needs a weight of >= 2 dims; mxfp4/nvfp4
  // need axis != 0; nf4 needs each expert's element count to be a multiple of blocksize.
  at::Tensor experts;
  at::Tensor out;  // optional preallocated output
  bool check_values = true;  // range-check `experts` on the host (a device sync)
};

void validate(const DequantArgs& args);

// No backward: quantised weights are frozen. The result must be deterministic and, because each output
// element is a table value times a scale, it must match the reference to within one rounding into
// `dtype` (docs/ops/dequant.md: 1e-6 fp32, 4e-3 bf16, 5e-4 fp16, norm-relative).
class Dequant : public KernelBackend {
 public:
  static constexpr const char* kOp = "dequant";

  at::Tensor dequantize(const DequantArgs& args) {
    validate(args);
    return run(args);
  }

 protected:
  virtual at::Tensor run(const DequantArgs& args) = 0;
};

}  // namespace ax::ops
