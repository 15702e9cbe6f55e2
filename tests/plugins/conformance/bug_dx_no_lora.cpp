// Planted bug: dX leaves out the LoRA path (only grad·W_eᵀ); dA, dB, dgates are right.
#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_dx_no_lora", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "moe.experts", "name": "bug_dx_no_lora",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["dense"], "layouts": ["EKN"]}}]
})")

namespace {
struct Bug : axtest::MoeWrap {
  ax::ops::MoeExpertsGrads run_backward(const ax::ops::MoeExpertsArgs& a, const ax::ops::MoeExpertsBackwardArgs& b) override {
    ax::ops::MoeExpertsGrads g = MoeWrap::run_backward(a, b);
    if (!a.lora_a.defined() || !b.need_dx) return g;
    ax::ops::MoeExpertsArgs base = a;
    base.lora_a = base.lora_b = at::Tensor();
    ax::ops::MoeExpertsBackwardArgs bb;
    bb.grad_y = b.grad_y;
    bb.saved = axtest::reference<ax::ops::MoeExperts>()->forward(base).saved;
    bb.need_dgates = false;
    bb.out.dx = g.dx;  // overwrite in place (it may be the caller's preallocated dx)
    g.dx = axtest::reference<ax::ops::MoeExperts>()->backward(base, bb).dx;
    return g;
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeExperts>("bug_dx_no_lora", std::make_shared<Bug>()); }
