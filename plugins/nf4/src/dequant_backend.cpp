// The dequant backend for nf4 weights (ops::Dequant, docs/ops/dequant.md): whole or selective, into a
// fresh tensor or the caller's `out`, through the kernels of nf4.hpp. No host synchronisation (the
// selective ids are read on the device), so it captures into CUDA graphs.
#include <ATen/ATen.h>

#include <axengine/error.hpp>
#include <axengine/strings.hpp>

#include "backends.hpp"
#include "nf4.hpp"

namespace ax::nf4 {
namespace {

class Nf4Dequant final : public ops::Dequant {
 protected:
  at::Tensor run(const ops::DequantArgs& a) override {
    const ops::WeightTensor& w = a.weight;
    if (w.format != ops::WeightFormat::nf4)
      throw UsageError(str("dequant[nf4]: weight: only nf4 weights are served, got ", w.describe()));
    auto shape = w.shape;
    if (a.experts.defined()) shape[0] = a.experts.numel();
    // fp64 (accepted by the op for gradient checks) is decoded in fp32 and widened: exactly what the
    // reference does (values in fp32, rounded once).
    const at::ScalarType decode = a.dtype == at::kDouble ? at::kFloat : a.dtype;
    const bool direct = a.out.defined() && a.out.is_contiguous() && a.out.scalar_type() == decode;
    at::Tensor y = direct ? a.out : at::empty(shape, w.codes.options().dtype(decode));
    if (y.numel() > 0) {
      if (a.experts.defined()) dequantize_experts(w, a.experts, y);
      else dequantize_range(w, 0, y);
    }
    if (a.out.defined() && !direct) {
      a.out.copy_(y);
      return a.out;
    }
    return decode == a.dtype ? y : y.to(a.dtype);
  }
};

}  // namespace

std::shared_ptr<ops::Dequant> make_dequant() { return std::make_shared<Nf4Dequant>(); }

}  // namespace ax::nf4
