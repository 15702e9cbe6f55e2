// Planted bug: nvfp4 block scales decoded as E8M0 (2^(s-127), the mxfp4 encoding) instead of E4M3.
// The rest (E2M1 codes, low nibble first, the global scale, selective experts) is right.
#include <ATen/ATen.h>

#include <axengine/ops/quant.hpp>

#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_nvfp4_e8m0", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "dequant", "name": "bug_nvfp4_e8m0",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["nvfp4", "mxfp4"]}}]
})")

namespace {
struct Bug : axtest::DequantWrap {
  at::Tensor run(const ax::ops::DequantArgs& a) override {
    const ax::ops::WeightTensor& w = a.weight;
    if (w.format != ax::ops::WeightFormat::nvfp4) return DequantWrap::run(a);
    const int64_t nd = w.dim(), axis = w.axis < 0 ? w.axis + nd : w.axis;
    // Codes pack two per byte along the blocked axis: unpack there (pack_nibbles works on the last dim).
    at::Tensor codes = ax::ops::unpack_nibbles(w.codes.movedim(axis, -1), /*first_high=*/false).movedim(-1, axis);
    at::Tensor bits = w.scales.scalar_type() == at::kByte ? w.scales : w.scales.view(at::kByte);
    at::Tensor scale = ax::ops::e8m0_decode(bits).repeat_interleave(w.blocksize, axis);  // the bug
    at::Tensor v = ax::ops::e2m1_decode(codes) * scale;
    at::Tensor g = w.global_scale.to(at::kFloat);
    if (g.dim() == 1) {
      std::vector<int64_t> shape(nd, 1);
      shape[0] = g.size(0);
      g = g.view(shape);
    }
    v = v * g;
    if (a.experts.defined()) v = v.index_select(0, a.experts);
    v = v.to(a.dtype);
    if (a.out.defined()) return a.out.copy_(v);
    return v;
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::Dequant>("bug_nvfp4_e8m0", std::make_shared<Bug>()); }
