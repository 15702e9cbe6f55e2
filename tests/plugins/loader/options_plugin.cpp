// A plugin that owns config tables (PluginRegistrar::backend_options and config_table): its dequant backend
// "test_options" returns the reference result times [kernels.options.test_options] scale, plus the
// [test_options] offset, so a test sees the bound options reach the backend. Built a second time as
// "test_options_stray" (AX_STRAY_TABLES), which also declares tables it may not own: the loader ignores them.
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

#ifndef AX_TEST_NAME
#define AX_TEST_NAME "test_options"
#endif

AXENGINE_PLUGIN_DESCRIPTOR(R"({"name": ")" AX_TEST_NAME R"(", "version": "1.0.0",
  "providers": [{"kind": "kernel", "op": "dequant", "name": ")" AX_TEST_NAME R"(", "requires": {"devices": ["cpu"]},
                 "summary": "reference dequant times the configured scale, plus the configured offset"}]})")

AXENGINE_PLUGIN_REGISTER(reg) {
  auto settings = std::make_shared<Settings>();
  reg.backend_options<BackendOptions>(AX_TEST_NAME, "options of the " AX_TEST_NAME " backend", bind_backend,
                                      [settings](const BackendOptions& o) { settings->backend = o; });
  reg.config_table<PluginOptions>(AX_TEST_NAME, "options of the " AX_TEST_NAME " plugin", bind_plugin,
                                  [settings](const PluginOptions& o) { settings->plugin = o; });
#ifdef AX_STRAY_TABLES
  // Neither a backend this plugin registers nor its own name: the loader keeps neither.
  reg.backend_options<BackendOptions>("not_mine", "stray", bind_backend, [](const BackendOptions&) {});
  reg.config_table<PluginOptions>("someone_else", "stray", bind_plugin, [](const PluginOptions&) {});
#endif
  reg.kernel<ax::ops::Dequant>(AX_TEST_NAME, std::make_shared<ScaledDequant>(settings));
}
