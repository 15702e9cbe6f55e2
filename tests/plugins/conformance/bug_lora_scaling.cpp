// Planted bug: the LoRA term scaled by alpha instead of alpha / r (scaling · r), forward and backward.
#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_lora_scaling", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "moe.experts", "name": "bug_lora_scaling",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["dense"], "layouts": ["EKN"]}}]
})")

namespace {
struct Bug : axtest::MoeWrap {
  static ax::ops::MoeExpertsArgs bug(ax::ops::MoeExpertsArgs a) {
    if (a.lora_a.defined()) a.scaling *= static_cast<double>(a.lora_a.size(0) / a.weight.size(0));
    return a;
  }
  ax::ops::MoeExpertsResult run_forward(const ax::ops::MoeExpertsArgs& a) override { return MoeWrap::run_forward(bug(a)); }
  ax::ops::MoeExpertsGrads run_backward(const ax::ops::MoeExpertsArgs& a, const ax::ops::MoeExpertsBackwardArgs& b) override {
    return MoeWrap::run_backward(bug(a), b);
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeExperts>("bug_lora_scaling", std::make_shared<Bug>()); }
