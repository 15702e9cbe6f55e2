// Picks the backends and devices to certify, and runs each op's cases for them.
#include <algorithm>
#include <filesystem>
#include <map>

#include "axengine/conformance.hpp"
#include "axengine/device.hpp"
#include "axengine/op_spec.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance {
namespace {

using detail::CaseRunner;
using detail::Target;

// The claimed values the op defines (claimed empty: all of them).
std::vector<std::string> claimed(const std::vector<std::string>& claim, const std::vector<std::string>& defined) {
  if (claim.empty()) return defined;
  std::vector<std::string> out;
  for (const auto& d : defined)
    if (std::find(claim.begin(), claim.end(), d) != claim.end()) out.push_back(d);
  return out;
}

bool plugin_matches(const Provider& p, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const auto& f : filters) {
    if (p.info.plugin == f || p.info.origin == f) return true;
    std::error_code ec;
    if (std::filesystem::exists(f, ec) && std::filesystem::exists(p.info.origin, ec) &&
        std::filesystem::equivalent(f, p.info.origin, ec))
      return true;
  }
  return false;
}

void run_target(const Provider& backend, const Provider& reference, const std::string& device_name,
                const OpSpec& space, const Options& options, std::vector<CaseResult>& out) {
  Suite::State state;
  state.spec = &space;
  Target& t = state.target;
  t.backend = &backend;
  t.reference = &reference;
  t.quick = options.quick;
  t.seed = options.seed;
  t.dtypes = claimed(backend.info.needs.dtypes, space.dtypes);
  t.formats = claimed(backend.info.needs.formats, space.formats);
  t.layouts = claimed(backend.info.needs.layouts, space.layouts);
  CaseRunner cases(t, device_name, out, options.on_case, options.on_start);
  state.cases = &cases;
  const std::string prefix = backend.info.op + "/device";
  if (device_name == "cuda") {
    if (!at::hasCUDA()) return cases.skip_case(prefix, "no CUDA device present");
    DeviceInfo dev = detect_device("cuda");
    KernelQuery q;
    q.device = dev;
    if (auto unmet = unmet_requirement(backend.info.needs, q))
      return cases.skip_case(prefix, ax::str("this GPU (", dev.name, ", ", dev.arch_name(), ") is outside its requirements: ", *unmet));
    t.device = at::Device(at::kCUDA, 0);
    // The reference on CUDA is itself checked against the reference on the CPU.
    t.reference_device = backend.info.name == "reference" ? at::Device(at::kCPU) : t.device;
  }
  if (t.dtypes.empty())
    return cases.skip_case(prefix, ax::str("claims no dtype this op defines (", join(backend.info.needs.dtypes, "|"), ")"));
  if (!space.formats.empty() && t.formats.empty())
    return cases.skip_case(prefix, ax::str("claims no weight format this op defines (", join(backend.info.needs.formats, "|"), ")"));
  if (!space.layouts.empty() && t.layouts.empty())
    return cases.skip_case(prefix, ax::str("claims no layout this op defines (", join(backend.info.needs.layouts, "|"), ")"));
  Suite suite(state);
  space.conformance(suite);
}

}  // namespace

const char* to_string(Status s) {
  switch (s) {
    case Status::pass: return "pass";
    case Status::fail: return "fail";
    case Status::skip: return "skip";
  }
  return "?";
}

Tolerance tolerance(const std::string& dtype) {
  for (const auto& t : kTolerances)
    if (dtype == t.dtype) return t;
  throw UsageError(ax::str("conformance: no tolerance for dtype '", dtype, "'"));
}

int Report::count(Status s) const {
  return static_cast<int>(std::count_if(cases.begin(), cases.end(), [&](const CaseResult& c) { return c.status == s; }));
}

Report run(const Registry& registry, const Options& options) {
  // The ops are the registry's: core's and those the loaded plugins define.
  std::vector<std::string> ops;
  if (options.op.empty()) {
    for (const OpSpec* o : registry.ops()) ops.push_back(o->id);
  } else {
    const OpSpec* spec = registry.op(options.op);
    if (!spec) {
      std::vector<std::string> ids;
      for (const OpSpec* o : registry.ops()) ids.push_back(o->id);
      throw UsageError(ax::str("conformance: unknown op '", options.op, "' (known: ", join(ids, ", "), ")"));
    }
    ops.push_back(spec->id);
  }
  if (!options.device.empty() && options.device != "cpu" && options.device != "cuda")
    throw UsageError(ax::str("conformance: --device must be cpu or cuda, got '", options.device, "'"));

  Report report;
  int selected = 0;
  for (const auto& op : ops) {
    const OpSpec* space = registry.op(op);
    const Provider* reference = registry.find(ProviderKind::kernel, op, "reference");
    for (const Provider* p : registry.list(ProviderKind::kernel, op)) {
      if (!options.backend.empty() && p->info.name != options.backend) continue;
      if (!plugin_matches(*p, options.plugins)) continue;
      ++selected;
      std::vector<std::string> devices = p->info.needs.devices.empty() ? std::vector<std::string>{"cpu", "cuda"}
                                                                         : p->info.needs.devices;
      for (const auto& dev : devices) {
        if (!options.device.empty() && dev != options.device) continue;
        if (!space || !reference) {
          CaseResult r{op, p->info.name, p->info.plugin, dev, op + "/reference", Status::fail,
                       space ? "no `reference` backend is registered for this op: nothing to compare with"
                             : "the op has no OpSpec in this registry: no problems to run",
                       0};
          report.cases.push_back(r);
          if (options.on_case) options.on_case(report.cases.back());
          continue;
        }
        run_target(*p, *reference, dev, *space, options, report.cases);
      }
    }
  }
  if (selected == 0) {
    std::vector<std::string> have;
    for (const auto& op : ops)
      for (const Provider* p : registry.list(ProviderKind::kernel, op)) have.push_back(p->info.key() + " (" + p->info.plugin + ")");
    throw UsageError(ax::str("conformance: no backend matches", options.op.empty() ? "" : " --op " + options.op,
                         options.backend.empty() ? "" : " --backend " + options.backend,
                         options.plugins.empty() ? "" : " --plugin " + join(options.plugins, ","),
                         " (registered: ", have.empty() ? "none" : join(have, ", "), ")"));
  }
  return report;
}

}  // namespace ax::conformance
