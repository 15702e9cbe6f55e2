// The device a run targets, as kernel selection sees it.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace ax {

struct DeviceInfo {
  enum class Type { cpu, cuda };
  Type type = Type::cpu;
  int index = 0;            // CUDA device ordinal
  int arch = 0;             // compute capability x10: sm_90 -> 90, sm_120 -> 120; 0 on CPU
  std::string name = "cpu"; // e.g. "NVIDIA H200"
  std::string arch_source = "detected";  // or "AXENGINE_ARCH", "config device.arch"

  bool is_cuda() const { return type == Type::cuda; }
  // "cpu", or "sm_90" / "sm_120".
  std::string arch_name() const;
};

// Parses "sm_90", "sm_90a", "sm_120", "90" into 90 / 120; nullopt on anything else.
std::optional<int> parse_arch(std::string_view text);
std::string arch_name(int arch);

// What the run will use. `type` is "auto" (CUDA if available), "cpu" or "cuda" (an error if none).
// `arch_override` ("sm_120"), from the config or AXENGINE_ARCH (the environment wins), makes selection
// behave as on that GPU without one being present: kernel selection can be tested on a CPU machine.
DeviceInfo detect_device(const std::string& type = "auto", const std::string& arch_override = "");

}  // namespace ax
