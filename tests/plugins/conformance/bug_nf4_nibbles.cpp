// Planted bug: nf4 codes read with the nibbles swapped (first element taken from the LOW nibble, as
// mxfp4 packs them, while bitsandbytes puts it in the high one).
#include <ATen/ATen.h>

#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_nf4_nibbles", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "dequant", "name": "bug_nf4_nibbles",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["nf4", "mxfp4"]}}]
})")

namespace {
struct Bug : axtest::DequantWrap {
  at::Tensor run(const ax::ops::DequantArgs& a) override {
    if (a.weight.format != ax::ops::WeightFormat::nf4) return DequantWrap::run(a);
    ax::ops::DequantArgs b = a;
    at::Tensor c = a.weight.codes;
    b.weight.codes = at::bitwise_or(at::bitwise_left_shift(at::bitwise_and(c, 15), 4), at::bitwise_right_shift(c, 4));
    return DequantWrap::run(b);
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::Dequant>("bug_nf4_nibbles", std::make_shared<Bug>()); }
