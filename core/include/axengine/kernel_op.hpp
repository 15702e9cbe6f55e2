// Kernel ops: the operations the engine calls through the registry so that backends can be swapped per
// GPU. Each op has a written contract (docs/ops/<op>.md) and an abstract interface deriving from
// KernelBackend in core/include/axengine/ops/. A backend is an object implementing that interface,
// registered under (op id, backend name) with its Requirements; `reference` is the plain-ATen backend
// every op has.
#pragma once
#include <string>
#include <vector>

namespace ax {

// Base of every op interface. Backend objects are created when their plugin registers and must not
// touch a device in their constructor: selection may pass them over.
struct KernelBackend {
  virtual ~KernelBackend() = default;
};

struct OpInfo {
  std::string id;          // "moe.experts"
  std::string config_key;  // key under [kernels] in the run config: "moe"
  std::string summary;
};

// The ops the engine knows, in a fixed order. Backends may only be registered for these.
const std::vector<OpInfo>& known_ops();
const OpInfo* find_op(const std::string& id_or_config_key);

}  // namespace ax
