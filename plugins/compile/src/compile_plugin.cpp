// The compile plugin (docs/plugins/compile.md): the [compile] table (allow_list.hpp) and the step executor
// "compile" (executor.hpp). With enabled = false (the default) the executor declines and a run is exactly
// what it is without the plugin.
#include <memory>

#include <axengine/error.hpp>
#include <axengine/executor.hpp>
#include <axengine/plugin.hpp>

#include "allow_list.hpp"
#include "executor.hpp"
#include "setters.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "compile", "version": "0.1.0",
  "summary": "[compile]: CUDA-graph training steps, GEMM and kernel autotuning, precision knobs",
  "providers": [
    {"kind": "executor", "name": "compile",
     "summary": "applies [compile]; with cuda_graphs, captures the training step in CUDA graphs and replays it"}
  ]
})")

namespace {

class CompileProvider final : public ax::ExecutorProvider {
 public:
  explicit CompileProvider(std::shared_ptr<ax::compile::CompileOptions> options) : options_(std::move(options)) {}
  std::unique_ptr<ax::StepExecutor> create(const ax::ExecutorContext& context) const override {
    if (!options_->enabled()) return nullptr;
    ax::compile::Runtime runtime;
    runtime.device = context.device;
    ax::compile::apply_settings(runtime, options_->resolve(context.device.arch));
    return std::make_unique<ax::compile::CompileExecutor>(context, std::move(runtime));
  }

 private:
  std::shared_ptr<ax::compile::CompileOptions> options_;
};

}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) {
  // The rename sentinel, at load too: a key without a setter would be accepted and do nothing.
  if (std::string bad = ax::compile::sentinel_mismatch(); !bad.empty())
    throw ax::RuntimeError("compile plugin: the allow-list and its setters differ: " + bad);
  auto options = std::make_shared<ax::compile::CompileOptions>();
  reg.config_table<ax::compile::CompileOptions>(
      "compile", "the compile plugin: CUDA graphs, autotuning, precision knobs (docs/plugins/compile.md)",
      ax::compile::bind_compile, [options](const ax::compile::CompileOptions& o) { *options = o; });
  reg.executor("compile", std::make_shared<CompileProvider>(options));
}
