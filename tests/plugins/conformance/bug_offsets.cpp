// Planted bug: expert offsets off by one. Each expert's range ends one row early, so the last row of
// every expert is computed with the next expert's weights (forward and backward agree with each other,
// as a real kernel with this bug would).
#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_offsets", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "moe.experts", "name": "bug_offsets",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32", "bf16"], "formats": ["dense"], "layouts": ["EKN"]}}]
})")

namespace {
struct Bug : axtest::MoeWrap {
  static ax::ops::MoeExpertsArgs bug(ax::ops::MoeExpertsArgs a) {
    at::Tensor offs = a.routing.expert_offsets.to(at::kCPU).clone();
    at::Tensor ids = a.routing.sorted_expert_idxs.to(at::kCPU).clone();
    const int64_t E = offs.size(0), M = ids.size(0);
    auto o = offs.accessor<int64_t, 1>();
    for (int64_t e = 0; e + 1 < E; ++e) o[e] = std::max<int64_t>(o[e] - 1, e ? o[e - 1] : 0);
    auto id = ids.accessor<int64_t, 1>();
    int64_t e = 0;
    for (int64_t p = 0; p < M && p < o[E - 1]; ++p) {
      while (e < E && p >= o[e]) ++e;
      if (id[p] != -1) id[p] = e;  // inactive entries stay inactive
    }
    a.routing.expert_offsets = offs.to(a.routing.expert_offsets.device());
    a.routing.sorted_expert_idxs = ids.to(a.routing.sorted_expert_idxs.device());
    a.check_values = false;  // the kernel trusts its (wrong) offsets
    return a;
  }
  ax::ops::MoeExpertsResult run_forward(const ax::ops::MoeExpertsArgs& a) override { return MoeWrap::run_forward(bug(a)); }
  ax::ops::MoeExpertsGrads run_backward(const ax::ops::MoeExpertsArgs& a, const ax::ops::MoeExpertsBackwardArgs& b) override {
    return MoeWrap::run_backward(bug(a), b);
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeExperts>("bug_offsets", std::make_shared<Bug>()); }
