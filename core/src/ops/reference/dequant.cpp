// Reference dequant: the table look-ups and scales of axengine/ops/quant.hpp.
#include <memory>

#include "axengine/ops/dequant.hpp"
#include "axengine/ops/quant.hpp"
#include "ops/reference/common.hpp"

namespace ax::ops {
namespace {

class ReferenceDequant final : public Dequant {
 protected:
  at::Tensor run(const DequantArgs& a) override {
    return ref::emit(ops::dequantize(a.weight, at::kFloat, a.experts), a.dtype, a.out);
  }
};

}  // namespace

std::shared_ptr<Dequant> make_reference_dequant() { return std::make_shared<ReferenceDequant>(); }

}  // namespace ax::ops
