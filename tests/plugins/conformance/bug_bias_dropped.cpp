// Planted bug: the per-expert bias is never added.
#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_bias_dropped", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "moe.experts", "name": "bug_bias_dropped",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["dense"], "layouts": ["EKN"]}}]
})")

namespace {
struct Bug : axtest::MoeWrap {
  ax::ops::MoeExpertsResult run_forward(const ax::ops::MoeExpertsArgs& a) override {
    ax::ops::MoeExpertsArgs b = a;
    b.bias = at::Tensor();
    return MoeWrap::run_forward(b);
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeExperts>("bug_bias_dropped", std::make_shared<Bug>()); }
