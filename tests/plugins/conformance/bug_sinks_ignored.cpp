// Planted bug: attention sinks are silently dropped. The plugin lists no layouts, so it claims every one the
// op defines, "sinks" included, and the suite must hold it to the sink cases.
#include <ATen/ATen.h>

#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_sinks_ignored", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "attention", "name": "bug_sinks_ignored",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32"]}}]
})")

namespace {
struct Bug : axtest::AttentionWrap {
  ax::ops::AttentionResult run_forward(const ax::ops::AttentionArgs& a) override {
    ax::ops::AttentionArgs b = a;
    b.sinks = at::Tensor();
    return AttentionWrap::run_forward(b);
  }
  ax::ops::AttentionGrads run_backward(const ax::ops::AttentionArgs& a, const ax::ops::AttentionBackwardArgs& bwd) override {
    ax::ops::AttentionArgs b = a;
    b.sinks = at::Tensor();
    ax::ops::AttentionBackwardArgs d = bwd;
    d.grads_out.dsinks = at::Tensor();
    auto g = AttentionWrap::run_backward(b, d);
    if (a.sinks.defined()) g.dsinks = at::zeros_like(a.sinks);  // shaped right, valued wrong
    return g;
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::Attention>("bug_sinks_ignored", std::make_shared<Bug>()); }
