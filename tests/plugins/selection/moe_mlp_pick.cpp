// Two moe.mlp backends, "pick_a" and "pick_b", that forward every call to the built-in reference and say so: the
// first forward and the first backward each backend serves log one line ("test_moe_pick: pick_a served a moe.mlp
// forward"). tests/unit/moe_selection_cli_test.cpp trains with one or the other chosen by [kernels] moe_mlp (or its
// [kernels.arch.sm_XX] form) and reads which one ran.
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>

#include <axengine/builtins.hpp>
#include <axengine/log.hpp>
#include <axengine/ops/moe_mlp.hpp>
#include <axengine/plugin.hpp>

namespace {

std::shared_ptr<ax::ops::MoeMlp> reference() {
  // Never destroyed: the plugin may be unloaded after the host's static destructors ran.
  static ax::Registry* registry = [] {
    auto* r = new ax::Registry;
    ax::register_builtins(*r);
    return r;
  }();
  auto op = registry->kernel<ax::ops::MoeMlp>("reference");
  if (!op) throw std::runtime_error("no reference backend for moe.mlp");
  return op;
}

class CountingMoeMlp final : public ax::ops::MoeMlp {
 public:
  explicit CountingMoeMlp(std::string name) : name_(std::move(name)) {}

 protected:
  ax::ops::MoeMlpResult run_forward(const ax::ops::MoeMlpArgs& a) override {
    if (forwards_++ == 0) ax::log::info("test_moe_pick: " + name_ + " served a moe.mlp forward");
    return reference()->forward(a);
  }
  ax::ops::MoeMlpGrads run_backward(const ax::ops::MoeMlpArgs& a, const ax::ops::MoeMlpBackwardArgs& b) override {
    if (backwards_++ == 0) ax::log::info("test_moe_pick: " + name_ + " served a moe.mlp backward");
    return reference()->backward(a, b);
  }

 private:
  std::string name_;
  std::atomic<int64_t> forwards_{0}, backwards_{0};
};

}  // namespace

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_moe_pick", "version": "1.0.0",
  "providers": [
    {"kind": "kernel", "op": "moe.mlp", "name": "pick_a", "summary": "the reference moe.mlp, logging the calls it serves"},
    {"kind": "kernel", "op": "moe.mlp", "name": "pick_b", "summary": "the reference moe.mlp, logging the calls it serves"}
  ]})")

AXENGINE_PLUGIN_REGISTER(reg) {
  reg.kernel<ax::ops::MoeMlp>("pick_a", std::make_shared<CountingMoeMlp>("pick_a"));
  reg.kernel<ax::ops::MoeMlp>("pick_b", std::make_shared<CountingMoeMlp>("pick_b"));
}
