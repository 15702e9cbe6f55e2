// The registry of named providers that plugins (and core's built-ins) fill:
//   kernel    — a backend of one kernel op (key: op id + backend name), an ax::KernelBackend subclass
//   model     — a model family, keyed by HF config.json "model_type" (ax::ModelFamily)
//   dataset   — a dataset type, keyed by the `type` of a [[datasets]] entry (ax::DatasetType)
//   optimizer — an optimizer, keyed by [train] optimizer name (ax::OptimizerProvider)
//   op        — a kernel op, keyed by its id (ax::OpSpec, axengine/op_spec.hpp); adding one also registers
//               its `reference` kernel backend
//   quantizer — packs frozen weights into a weight format at model load (ax::ops::Quantizer); the formats
//               it produces are its requirements' `formats`
// Each entry records where it came from, so every listing and error can say so.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "axengine/error.hpp"
#include "axengine/requirements.hpp"

namespace ax {

struct OpSpec;

enum class ProviderKind { kernel, model, dataset, optimizer, op, quantizer, executor };
const char* to_string(ProviderKind kind);

struct ProviderInfo {
  ProviderKind kind = ProviderKind::kernel;
  std::string op;        // kernel providers: the op id ("moe.experts"); empty otherwise
  std::string name;      // "scattermoe", "qwen3_moe", "completion", "adamw", "reference"
  Requirements needs;   // from the plugin descriptor (built-ins: set in code)
  std::string plugin = "builtin";  // plugin name, or "builtin"
  std::string origin = "builtin";  // the plugin file, or "builtin"
  std::string summary;
  bool graph_safe = false;  // kernel providers: declared safe to capture in a CUDA graph (descriptor "graph_safe")
  std::string key() const;  // "kernel moe.experts/scattermoe", "model qwen3_moe"
};

struct Provider {
  ProviderInfo info;
  std::shared_ptr<void> object;  // the provider object; its type follows from info.kind (and op)
};

class Registry {
 public:
  // Throws UsageError naming both origins when (kind, op, name) is already taken, when a kernel
  // provider names an op that is not registered (core's ops are always known) or claims dtypes, formats
  // or layouts outside the op's space, and when an op's spec is incomplete.
  void add(Provider provider);

  // The registered ops (kind op), by id or config key; nullptr when none matches.
  const OpSpec* op(const std::string& id_or_config_key) const;
  std::vector<const OpSpec*> ops() const;  // in registration order

  const Provider* find(ProviderKind kind, const std::string& op, const std::string& name) const;
  std::vector<const Provider*> list(ProviderKind kind, const std::string& op = "") const;
  const std::vector<Provider>& all() const { return providers_; }

  // Typed look-ups. Op is an op interface with `static constexpr const char* kOp`.
  template <class Op>
  std::shared_ptr<Op> kernel(const std::string& name) const {
    const Provider* p = find(ProviderKind::kernel, Op::kOp, name);
    return p ? std::static_pointer_cast<Op>(p->object) : nullptr;
  }
  template <class T>
  std::shared_ptr<T> get(ProviderKind kind, const std::string& name) const {
    const Provider* p = find(kind, "", name);
    return p ? std::static_pointer_cast<T>(p->object) : nullptr;
  }

  // The process-wide registry: built-ins register here at start, the plugin loader adds to it.
  static Registry& global();

 private:
  std::vector<Provider> providers_;
};

}  // namespace ax
