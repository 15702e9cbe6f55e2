// validate() for dequant.
#include "axengine/ops/dequant.hpp"

#include <ATen/ATen.h>

#include "ops/check.hpp"

namespace ax::ops {

void validate(const DequantArgs& a) {
  constexpr const char* op = "dequant";
  if (a.weight.is_dense()) check::fail(op, "weight", "is dense: there is nothing to dequantise");
  validate_weight(a.weight, str(op, ": weight"));
  if (a.dtype != at::kFloat && a.dtype != at::kBFloat16 && a.dtype != at::kHalf && a.dtype != at::kDouble)
    check::fail(op, "dtype", str("must be fp32, bf16 or fp16, got ", check::dtype_str(a.dtype)));
  const at::Device dev = a.weight.device();
  auto shape = a.weight.shape;
  if (a.experts.defined()) {
    check::rank(op, "experts", a.experts, 1);
    check::dtype(op, "experts", a.experts, at::kLong);
    check::same_device(op, "experts", a.experts, "weight", dev);
    if (a.weight.dim() < 2) check::fail(op, "experts", str("needs a weight of >= 2 dims, got ", a.weight.describe()));
    if (a.weight.format == WeightFormat::fp8) {
      if (a.weight.dim() < 3) check::fail(op, "experts", str("an fp8 weight's blocks span its last two dims: selecting needs an expert dim before them, got ", a.weight.describe()));
    } else if (a.weight.format != WeightFormat::nf4) {
      const int64_t axis = a.weight.axis < 0 ? a.weight.axis + a.weight.dim() : a.weight.axis;
      if (axis == 0) check::fail(op, "experts", "the weight's blocked axis is dim 0, the expert dim");
    } else if ((a.weight.numel() / shape[0]) % a.weight.blocksize != 0) {
      check::fail(op, "experts", str("selective nf4 needs each expert's ", a.weight.numel() / shape[0],
                                     " elements to be a multiple of blocksize ", a.weight.blocksize));
    }
    if (a.check_values && a.experts.numel() > 0) {
      at::Tensor e = a.experts.to(at::kCPU);
      const int64_t lo = e.min().item<int64_t>(), hi = e.max().item<int64_t>();
      if (lo < 0 || hi >= shape[0])
        check::fail(op, "experts", str("ids must be in [0, ", shape[0], "), got ", lo < 0 ? lo : hi));
    }
    shape[0] = a.experts.numel();
  }
  check::out_like(op, "out", a.out, shape, a.dtype, dev);
}

}  // namespace ax::ops
