// A plugin that owns config tables (PluginRegistrar::backend_options and config_table): its dequant backend
// "test_options" returns the reference result times [kernels.options.test_options] scale, plus the
// [test_options] offset, so a test sees the bound options reach the backend.
#include <ATen/ATen.h>

#include "axengine/ops/dequant.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/plugin.hpp"

namespace {

struct BackendOptions {
  double scale = 1.0;
};
struct PluginOptions {
  double offset = 0.0;
};

void bind_backend(ax::TableBinder& t, BackendOptions& o) { t.positive("scale", o.scale, "multiplies every output"); }
void bind_plugin(ax::TableBinder& t, PluginOptions& o) { t.field("offset", o.offset, "added to every output"); }

struct Settings {
  BackendOptions backend;
  PluginOptions plugin;
};

class ScaledDequant final : public ax::ops::Dequant {
 public:
  explicit ScaledDequant(std::shared_ptr<const Settings> s) : s_(std::move(s)) {}

 protected:
  at::Tensor run(const ax::ops::DequantArgs& a) override {
    at::Tensor y = ax::ops::dequantize(a.weight, a.dtype, a.experts).mul(s_->backend.scale).add(s_->plugin.offset);
    if (!a.out.defined()) return y;
    a.out.copy_(y);
    return a.out;
  }

 private:
  std::shared_ptr<const Settings> s_;
};

}  // namespace

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": "test_options", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "dequant", "name": "test_options", "requires": {"devices": ["cpu"]},
                 "summary": "reference dequant times the configured scale, plus the configured offset"}]})")

AXENGINE_PLUGIN_REGISTER(reg) {
  auto settings = std::make_shared<Settings>();
  reg.backend_options<BackendOptions>("test_options", "options of the test_options backend", bind_backend,
                                      [settings](const BackendOptions& o) { settings->backend = o; });
  reg.config_table<PluginOptions>("test_options", "options of the test_options plugin", bind_plugin,
                                  [settings](const PluginOptions& o) { settings->plugin = o; });
  reg.kernel<ax::ops::Dequant>("test_options", std::make_shared<ScaledDequant>(settings));
}
