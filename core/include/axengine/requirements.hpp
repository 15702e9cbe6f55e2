// What a provider needs from the device and the call, as declared in its plugin descriptor, and the
// check that kernel selection runs against it.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "axengine/device.hpp"

namespace ax {

// Every list is "any" when empty.
struct Requirements {
  std::vector<std::string> devices;  // "cpu", "cuda"
  int arch_min = 0;                  // inclusive CUDA arch bounds (x10), 0 = unbounded
  int arch_max = 0;
  std::vector<std::string> dtypes;   // compute dtypes: "fp32", "bf16", "fp16"
  std::vector<std::string> formats;  // weight formats: "dense", "nf4", "mxfp4", "nvfp4"
  std::vector<std::string> layouts;  // weight layouts, op specific (moe.experts: "EKN", "ENK")

  std::string describe() const;      // one line, for `plugins list`
};

// What a call site asks for. Empty strings are "not specified" and match anything.
struct KernelQuery {
  DeviceInfo device;
  std::string dtype;
  std::string format;
  std::string layout;
};

// nullopt when `req` admits `q`; otherwise the first unmet requirement, e.g.
// "needs sm_90..sm_100, device is sm_120" or "needs dtype bf16|fp16, asked for fp32".
std::optional<std::string> unmet_requirement(const Requirements& req, const KernelQuery& q);

}  // namespace ax
