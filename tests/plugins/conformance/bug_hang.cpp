// Planted bug: dequant never returns for an empty expert list (a kernel launched with a zero-sized grid
// that waits on a flag, say). The CLI's watchdog must turn the hang into a failure naming the case.
#include <chrono>
#include <thread>

#include "wrap.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "conf_bug_hang", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "dequant", "name": "bug_hang",
                 "requires": {"devices": ["cpu"], "dtypes": ["fp32"], "formats": ["nf4"]}}]
})")

namespace {
struct Bug : axtest::DequantWrap {
  at::Tensor run(const ax::ops::DequantArgs& a) override {
    if (a.experts.defined() && a.experts.numel() == 0)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    return DequantWrap::run(a);
  }
};
}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::Dequant>("bug_hang", std::make_shared<Bug>()); }
