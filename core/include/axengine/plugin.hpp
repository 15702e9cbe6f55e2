// Writing a plugin: the two macros below are all a plugin .so needs besides its provider classes.
//
//   #include <axengine/plugin.hpp>
//   AXENGINE_PLUGIN_DESCRIPTOR(R"({
//     "name": "myplugin", "version": "1.0.0",
//     "providers": [ {"kind": "kernel", "op": "moe.experts", "name": "mymoe",
//                     "requires": {"devices": ["cuda"], "arch_min": "sm_80", "dtypes": ["bf16"]}} ]
//   })")
//   AXENGINE_PLUGIN_REGISTER(reg) { reg.kernel<ax::ops::MoeExperts>("mymoe", std::make_shared<MyMoe>()); }
//
// The descriptor is a constant string placed in the ELF section "axengine_plugin". The host reads it from
// the file WITHOUT loading the library, and wraps the author's JSON with the plugin ABI version and a
// build fingerprint (LibTorch version, CUDA version, compiler, C++ ABI flag) taken from the macros this
// translation unit was compiled with. Only if those match the host is the library loaded and
// `axengine_plugin_register` called. Providers registered there must be declared in the descriptor
// (their requirements come from it); if registration throws, nothing it registered is kept.
// docs/plugins.md has the full guide.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/headeronly/version.h>

#include "axengine/config_binder.hpp"
#include "axengine/op_spec.hpp"
#include "axengine/registry.hpp"
#include "axengine/version.hpp"

#define AXENGINE_STR_(x) #x
#define AXENGINE_STR(x) AXENGINE_STR_(x)

// The fingerprint fields. The AXENGINE_DESCRIPTOR_* overrides exist for the loader's own tests, which
// build plugins that claim another ABI or LibTorch; a real plugin never sets them.
#ifndef AXENGINE_DESCRIPTOR_ABI
#define AXENGINE_DESCRIPTOR_ABI AXENGINE_STR(AXENGINE_PLUGIN_ABI_MAJOR) "." AXENGINE_STR(AXENGINE_PLUGIN_ABI_MINOR)
#endif
#ifndef AXENGINE_DESCRIPTOR_TORCH
#define AXENGINE_DESCRIPTOR_TORCH \
  AXENGINE_STR(TORCH_VERSION_MAJOR) "." AXENGINE_STR(TORCH_VERSION_MINOR) "." AXENGINE_STR(TORCH_VERSION_PATCH)
#endif
#ifndef AXENGINE_TORCH_CUDA  // set by the build (ax::torch target) from the LibTorch in use
#define AXENGINE_TORCH_CUDA "none"
#endif
#if defined(__clang__)
#define AXENGINE_DESCRIPTOR_COMPILER "clang " AXENGINE_STR(__clang_major__)
#elif defined(__GNUC__)
#define AXENGINE_DESCRIPTOR_COMPILER "gcc " AXENGINE_STR(__GNUC__)
#else
#define AXENGINE_DESCRIPTOR_COMPILER "unknown"
#endif
#ifdef _GLIBCXX_USE_CXX11_ABI
#define AXENGINE_DESCRIPTOR_CXX11_ABI AXENGINE_STR(_GLIBCXX_USE_CXX11_ABI)
#else
#define AXENGINE_DESCRIPTOR_CXX11_ABI "n/a"
#endif

#define AXENGINE_DESCRIPTOR_SECTION "axengine_plugin"

// `json` must be a string literal (a raw string R"(...)" is easiest).
#define AXENGINE_PLUGIN_DESCRIPTOR(json)                                                          \
  extern "C" __attribute__((section(AXENGINE_DESCRIPTOR_SECTION), used, visibility("default")))  \
  const char axengine_plugin_descriptor[] =                                                     \
      "{\"axengine_plugin\": 1, \"abi\": \"" AXENGINE_DESCRIPTOR_ABI "\", \"fingerprint\": {"     \
      "\"torch\": \"" AXENGINE_DESCRIPTOR_TORCH "\", \"cuda\": \"" AXENGINE_TORCH_CUDA "\", "       \
      "\"compiler\": \"" AXENGINE_DESCRIPTOR_COMPILER "\", \"cxx11_abi\": \"" AXENGINE_DESCRIPTOR_CXX11_ABI \
      "\"}, \"plugin\": " json "}";

#define AXENGINE_PLUGIN_REGISTER(registrar)                                                 \
  extern "C" __attribute__((visibility("default"))) void axengine_plugin_register(         \
      ax::PluginRegistrar& registrar)

namespace ax {

struct KernelBackend;
struct ModelFamily;
struct DatasetType;
struct OptimizerProvider;
class ExecutorProvider;
namespace ops {
class Quantizer;
}

// Collects what one plugin registers; the loader commits it to the registry only after
// axengine_plugin_register returned normally.
class PluginRegistrar {
 public:
  template <class Op>
  void kernel(const std::string& name, std::shared_ptr<Op> backend) {
    stage(ProviderKind::kernel, Op::kOp, name, std::static_pointer_cast<void>(std::move(backend)));
  }
  void model_family(const std::string& name, std::shared_ptr<ModelFamily> family) {
    stage(ProviderKind::model, "", name, std::static_pointer_cast<void>(std::move(family)));
  }
  void dataset_type(const std::string& name, std::shared_ptr<DatasetType> type) {
    stage(ProviderKind::dataset, "", name, std::static_pointer_cast<void>(std::move(type)));
  }
  void optimizer(const std::string& name, std::shared_ptr<OptimizerProvider> provider) {
    stage(ProviderKind::optimizer, "", name, std::static_pointer_cast<void>(std::move(provider)));
  }
  // A step runner of the trainer (axengine/executor.hpp).
  void executor(const std::string& name, std::shared_ptr<ExecutorProvider> provider) {
    stage(ProviderKind::executor, "", name, std::static_pointer_cast<void>(std::move(provider)));
  }
  // Defines a kernel op (axengine/op_spec.hpp): Op is its interface (spec.id must equal Op::kOp) and
  // `reference` its reference backend, registered with it as (spec.id, "reference"). Declared in the
  // descriptor as {"kind": "op", "name": "<id>"}; the plugin's kernels of that op are added after it.
  template <class Op>
  void op(OpSpec spec, std::shared_ptr<Op> reference) {
    if (spec.id != Op::kOp)
      throw UsageError("PluginRegistrar::op: spec id '" + spec.id + "' is not the interface's op '" + Op::kOp + "'");
    spec.reference = std::static_pointer_cast<void>(std::shared_ptr<Op>(std::move(reference)));
    std::string id = spec.id;
    stage(ProviderKind::op, "", std::move(id), std::make_shared<OpSpec>(std::move(spec)));
  }

  // The options of one of this plugin's kernel backends: the table [kernels.options.<backend>] of the run
  // config. `bind` binds every key the table accepts into an Options (TableBinder: typed values, errors with
  // file:line:column; keys it does not bind are refused with the closest known one). Once the whole config
  // is bound, `configure` receives the options, before any kernel runs. A backend used without a run
  // config (a test that calls the registration directly) keeps Options' defaults.
  //
  //   auto opts = std::make_shared<MyOptions>();
  //   reg.backend_options<MyOptions>("mymoe", "options of mymoe", bind_my_options,
  //                                  [opts](const MyOptions& o) { *opts = o; });
  //   reg.kernel<ax::ops::MoeExperts>("mymoe", std::make_shared<MyMoe>(opts));
  template <class Options>
  void backend_options(const std::string& backend, const std::string& doc, void (*bind)(TableBinder&, Options&),
                       std::function<void(const Options&)> configure) {
    table<Options>("kernels.options." + backend, doc, bind, std::move(configure));
  }
  // A top-level table [<name>] for options of the plugin as a whole; `name` must be the plugin's own.
  template <class Options>
  void config_table(const std::string& name, const std::string& doc, void (*bind)(TableBinder&, Options&),
                    std::function<void(const Options&)> configure) {
    table<Options>(name, doc, bind, std::move(configure));
  }
  // The formats it produces (and the devices it runs on) come from the descriptor's requires.
  void quantizer(const std::string& name, std::shared_ptr<ops::Quantizer> quantizer) {
    stage(ProviderKind::quantizer, "", name, std::static_pointer_cast<void>(std::move(quantizer)));
  }

  struct Staged {
    ProviderKind kind;
    std::string op, name;
    std::shared_ptr<void> object;
  };
  const std::vector<Staged>& staged() const { return staged_; }
  const std::vector<PluginConfigTable>& config_tables() const { return tables_; }

 private:
  void stage(ProviderKind kind, std::string op, std::string name, std::shared_ptr<void> object) {
    staged_.push_back({kind, std::move(op), std::move(name), std::move(object)});
  }
  template <class Options>
  void table(std::string path, const std::string& doc, void (*bind)(TableBinder&, Options&),
             std::function<void(const Options&)> configure) {
    tables_.push_back({std::move(path), doc, [bind, configure = std::move(configure)](TableBinder& t) {
                         Options options;
                         bind(t, options);
                         if (!t.context().docs && configure) configure(options);
                       }, ""});
  }
  std::vector<Staged> staged_;
  std::vector<PluginConfigTable> tables_;
};

using PluginRegisterFn = void(PluginRegistrar&);

}  // namespace ax
