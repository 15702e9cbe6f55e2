// Kernel backend selection per GPU.
//
// For each op, the run config gives a preference list ([kernels] moe = ["sonicmoe", "scattermoe"]),
// optionally overridden per device arch ([kernels.arch.sm_120] moe = [...]). The first backend in the
// list that is registered and whose requirements admit the query (device, arch, dtype, weight format,
// layout) wins. `reference` is appended as the last resort unless `strict`, in which case "nothing
// matched" is an error. An op the config does not mention tries every registered backend: plugins' in
// name order first, then core's production backends (`aten`) in name order, `reference` last (in strict
// mode too) — except ops with a written default order (moe.mlp: sonicmoe, scattermoe, reference).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "axengine/error.hpp"
#include "axengine/registry.hpp"
#include "axengine/requirements.hpp"

namespace ax {
namespace ops {
class Quantizer;
}

struct KernelPreferences {
  std::map<std::string, std::vector<std::string>> prefer;                 // op id -> backends
  std::map<int, std::map<std::string, std::vector<std::string>>> by_arch;  // arch -> op id -> backends
  bool strict = false;
};

struct Resolution {
  struct Candidate {
    std::string backend;
    std::string verdict;  // "chosen", or why it was passed over ("not registered", "needs sm_90..sm_100, ...")
  };
  std::string op;
  KernelQuery query;
  std::string list_source;  // "[kernels]", "[kernels.arch.sm_120]" or "default (all registered)"
  std::string chosen;       // empty when nothing matched (only possible in strict mode)
  std::vector<Candidate> candidates;
  // Candidates after `chosen` whose requirements admit the query too, in order: where an op's backends can
  // decline a call at run time (MoeMlp::decline), the next of these serves it.
  std::vector<std::string> fallbacks;
};

// Never throws for "nothing matched": the Resolution says so (chosen empty). KernelSet turns it into
// an error.
Resolution resolve_backend(const Registry& registry, const KernelPreferences& prefs, const std::string& op,
                           const KernelQuery& query);

// The quantizer for `format` on `query.device`: quantizer providers whose requirements admit the query
// (formats = what they produce), plugins in name order first, `reference` last. Not configurable and not
// affected by kernels.strict: quantising is a load step, and every quantizer must give the reference's
// bits. The Resolution's op is "quantize".
Resolution resolve_quantizer(const Registry& registry, const KernelQuery& query);

// The kernels one model instance calls: resolves (op, dtype, format, layout) once, caches the backend.
class KernelSet {
 public:
  KernelSet(const Registry& registry, KernelPreferences prefs, DeviceInfo device);

  // Throws UsageError (strict mode, nothing matched) naming the op and every candidate's verdict.
  template <class Op>
  std::shared_ptr<Op> get(const std::string& dtype, const std::string& format = "", const std::string& layout = "") {
    return std::static_pointer_cast<Op>(get_backend(Op::kOp, dtype, format, layout));
  }
  std::shared_ptr<void> get_backend(const std::string& op, const std::string& dtype, const std::string& format,
                                    const std::string& layout);
  // The chosen backend, then the run-time fallbacks (Resolution::fallbacks), by name.
  template <class Op>
  std::vector<std::pair<std::string, std::shared_ptr<Op>>> get_all(const std::string& dtype, const std::string& format = "",
                                                                   const std::string& layout = "") {
    std::vector<std::pair<std::string, std::shared_ptr<Op>>> out;
    for (auto& [name, obj] : get_chain(Op::kOp, dtype, format, layout))
      out.emplace_back(name, std::static_pointer_cast<Op>(obj));
    return out;
  }
  std::vector<std::pair<std::string, std::shared_ptr<void>>> get_chain(const std::string& op, const std::string& dtype,
                                                                       const std::string& format,
                                                                       const std::string& layout);

  // The quantizer for a weight format on this device (resolve_quantizer; cached, listed in resolutions()).
  // Throws UsageError when none is registered for the format.
  std::shared_ptr<ops::Quantizer> quantizer(const std::string& format);

  const DeviceInfo& device() const { return device_; }
  std::vector<Resolution> resolutions() const;  // everything resolved so far, in order

 private:
  const Registry& registry_;
  KernelPreferences prefs_;
  DeviceInfo device_;
  mutable std::mutex mu_;
  std::vector<std::pair<Resolution, std::shared_ptr<void>>> cache_;
};

}  // namespace ax
