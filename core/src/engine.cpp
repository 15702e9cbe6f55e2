#include "axengine/engine.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "axengine/builtins.hpp"
#include "axengine/error.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/op_spec.hpp"
#include "axengine/log.hpp"
#include "axengine/model_check.hpp"
#include "axengine/strings.hpp"
#include "models/bnb_config.hpp"
#include "models/hf_config.hpp"

namespace ax {

std::unique_ptr<Engine> Engine::start(const StartOptions& o) {
  std::unique_ptr<Engine> e(new Engine());
  // Phase 1: what loading plugins needs.
  e->config = read_config(o.config_file, o.overrides);
  log::Level level;
  if (!std::getenv("AXENGINE_LOG") && log::parse_level(e->config.run.log_level, level)) log::set_level(level);
  register_builtins(e->registry);
  e->plugins = std::make_unique<PluginLoader>(e->registry);
  for (const auto& f : o.plugin_files) e->plugins->load_file(f, "command line");
  if (o.discover) e->plugins->discover(e->config.plugins.paths, o.exe_dir);
  // Phase 2: the whole config, plugin tables included; plugins receive their options here.
  bind_config(e->config, e->plugins->config_tables());
  e->device = detect_device(e->config.device.type, e->config.device.arch);
  e->dtype = resolve_dtype(e->config.model.dtype, e->device.is_cuda());
  return e;
}

std::unique_ptr<Engine> Engine::start(const std::string& config_file, const std::vector<std::string>& overrides,
                                      const std::string& exe_dir) {
  if (config_file.empty()) throw UsageError("no config file given");
  StartOptions o;
  o.config_file = config_file;
  o.overrides = overrides;
  o.exe_dir = exe_dir;
  return start(o);
}

namespace {

// Whether the model directory holds a pre-quantised (bitsandbytes 4-bit) checkpoint: its projections are nf4 when
// weight_format is unset, and nothing is quantised at load (docs/weights.md). A config.json that cannot be read
// or parsed is not judged here: the model load reports it with its file and key.
bool prequantised(const ModelSection& m) {
  if (m.path.empty()) return false;
  const auto path = (std::filesystem::path(m.path) / "config.json").string();
  if (!std::filesystem::is_regular_file(path)) return false;
  try {
    return models::parse_bnb_config(models::read_json_file(path), path).present;
  } catch (const UsageError&) {
    return false;
  }
}

}  // namespace

std::vector<Resolution> Engine::resolve_calls(const std::vector<OpCall>& calls, const std::string& quantize) const {
  std::vector<Resolution> out;
  for (const auto& c : calls) out.push_back(resolve_backend(registry, config.kernels, c.op, KernelQuery{device, dtype, c.format, c.layout}));
  if (!quantize.empty()) out.push_back(resolve_quantizer(registry, KernelQuery{device, "", quantize, ""}));
  return out;
}

std::vector<Resolution> Engine::resolve_all() const {
  // No model to ask what it calls: every op a model may call, linear.lora dense (lm_head) and in weight_format,
  // moe.mlp in weight_format (ENK, the HF layout), and the quantizer that packs the base. moe.experts and dequant
  // are left out: no model calls them (moe.mlp backends run their own expert kernels, every backend dequantises
  // inside), and [kernels] refuses lists for them (config.cpp).
  // A pre-quantised checkpoint holds nf4 projections under weight_format dense or nf4, and needs no quantizer.
  const bool stored_nf4 = config.model.weight_format == "dense" && prequantised(config.model);
  const std::string fmt = stored_nf4 ? "nf4" : config.model.weight_format;
  std::vector<Resolution> out;
  for (const OpSpec* op : registry.ops()) {
    if (op->id == "dequant" || op->id == "moe.experts") continue;
    KernelQuery q{device, dtype, "", ""};
    if (op->id == "linear.lora") {
      q.format = "dense";
      out.push_back(resolve_backend(registry, config.kernels, op->id, q));
      if (fmt == "dense") continue;
      q.format = fmt;
    } else if (op->id == "moe.mlp") {
      q.format = fmt;
      q.layout = "ENK";
    } else if (!op->formats.empty()) {
      // An op a plugin defined that reads the frozen base (its spec has formats): asked in the run's format.
      q.format = fmt;
      if (fmt == "dense" && std::find(op->formats.begin(), op->formats.end(), "dense") == op->formats.end()) continue;
    }
    out.push_back(resolve_backend(registry, config.kernels, op->id, q));
  }
  if (fmt != "dense" && !stored_nf4 && !(fmt == "nf4" && prequantised(config.model)))
    out.push_back(resolve_quantizer(registry, KernelQuery{device, "", fmt, ""}));
  return out;
}

std::shared_ptr<KernelSet> Engine::kernel_set() const {
  return std::make_shared<KernelSet>(registry, config.kernels, device);
}

std::string format_resolution_table(const std::vector<Resolution>& resolutions, const DeviceInfo& device) {
  std::ostringstream os;
  os << "kernel backends for " << device.arch_name();
  if (device.is_cuda()) os << " (" << device.name << ", arch " << device.arch_source << ")";
  os << "\n";
  std::size_t w_op = 2, w_be = 7;
  for (const auto& r : resolutions) {
    w_op = std::max(w_op, r.op.size());
    w_be = std::max(w_be, r.chosen.empty() ? std::size_t(6) : r.chosen.size());
  }
  auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  os << "  " << pad("op", w_op) << "  " << pad("backend", w_be) << "  query / list / passed over\n";
  for (const auto& r : resolutions) {
    std::vector<std::string> q;
    for (const std::string* part : {&r.query.dtype, &r.query.format, &r.query.layout})
      if (!part->empty()) q.push_back(*part);
    os << "  " << pad(r.op, w_op) << "  " << pad(r.chosen.empty() ? "(none)" : r.chosen, w_be) << "  "
       << join(q, ",") << " from " << r.list_source << "\n";
    for (const auto& c : r.candidates)
      if (c.verdict != "chosen") os << "  " << pad("", w_op) << "  " << pad("", w_be) << "    " << c.backend << ": " << c.verdict << "\n";
    if (!r.fallbacks.empty() && r.op == "moe.mlp")  // the ops whose backends can decline a call at run time
      os << "  " << pad("", w_op) << "  " << pad("", w_be) << "    run-time fallback when " << r.chosen
         << " declines a call: " << join(r.fallbacks, ", ") << "\n";
  }
  return os.str();
}

}  // namespace ax
