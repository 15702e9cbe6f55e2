#include "axengine/requirements.hpp"

#include <algorithm>

#include "axengine/strings.hpp"

namespace ax {
namespace {

bool admits(const std::vector<std::string>& allowed, const std::string& v) {
  return allowed.empty() || v.empty() || std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::string arch_range(const Requirements& r) {
  if (r.arch_min && r.arch_max) return str(arch_name(r.arch_min), "..", arch_name(r.arch_max));
  if (r.arch_min) return str(arch_name(r.arch_min), " or newer");
  return str(arch_name(r.arch_max), " or older");
}

}  // namespace

std::string Requirements::describe() const {
  std::vector<std::string> parts;
  parts.push_back("devices=" + (devices.empty() ? std::string("any") : join(devices, "|")));
  if (arch_min || arch_max) parts.push_back("arch=" + arch_range(*this));
  if (!dtypes.empty()) parts.push_back("dtypes=" + join(dtypes, "|"));
  if (!formats.empty()) parts.push_back("formats=" + join(formats, "|"));
  if (!layouts.empty()) parts.push_back("layouts=" + join(layouts, "|"));
  return join(parts, " ");
}

std::optional<std::string> unmet_requirement(const Requirements& r, const KernelQuery& q) {
  const std::string dev = q.device.is_cuda() ? "cuda" : "cpu";
  if (!admits(r.devices, dev)) return str("needs ", join(r.devices, "|"), ", device is ", dev);
  if (q.device.is_cuda() && ((r.arch_min && q.device.arch < r.arch_min) || (r.arch_max && q.device.arch > r.arch_max)))
    return str("needs ", arch_range(r), ", device is ", q.device.arch_name());
  if (!admits(r.dtypes, q.dtype)) return str("needs dtype ", join(r.dtypes, "|"), ", asked for ", q.dtype);
  if (!admits(r.formats, q.format)) return str("needs weight format ", join(r.formats, "|"), ", asked for ", q.format);
  if (!admits(r.layouts, q.layout)) return str("needs layout ", join(r.layouts, "|"), ", asked for ", q.layout);
  return std::nullopt;
}

}  // namespace ax
