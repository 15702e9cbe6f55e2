// The registry of named providers that plugins (and core's built-ins) fill:
//   kernel    — a backend of one kernel op (key: op id + backend name), an ax::KernelBackend subclass
//   model     — a model family, keyed by HF config.json "model_type" (ax::ModelFamily)
//   dataset   — a dataset type, keyed by the `type` of a [[datasets]] entry (ax::DatasetType)
//   optimizer — an optimizer, keyed by [train] optimizer name (ax::OptimizerProvider)
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

enum class ProviderKind { kernel, model, dataset, optimizer, quantizer };
const char* to_string(ProviderKind kind);

struct ProviderInfo {
  ProviderKind kind = ProviderKind::kernel;
  std::string op;        // kernel providers: the op id ("moe.experts"); empty otherwise
  std::string name;      // "scattermoe", "qwen3_moe", "completion", "adamw", "reference"
  Requirements needs;   // from the plugin descriptor (built-ins: set in code)
  std::string plugin = "builtin";  // plugin name, or "builtin"
  std::string origin = "builtin";  // the plugin file, or "builtin"
  std::string summary;
  std::string key() const;  // "kernel moe.experts/scattermoe", "model qwen3_moe"
};

struct Provider {
  ProviderInfo info;
  std::shared_ptr<void> object;  // the provider object; its type follows from info.kind (and op)
};

class Registry {
 public:
  // Throws UsageError naming both origins when (kind, op, name) is already taken, and when a kernel
  // provider names an op that core does not know.
  void add(Provider provider);

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
