// The plugin ABI rule the loader enforces (the rule for bumping the numbers is in version.hpp and
// docs/plugins.md): a plugin loads when its ABI major equals the host's and its minor is not newer. An older
// minor is fine, because a minor bump only adds what old plugins never use; a newer minor may call what
// this host lacks.
#pragma once
#include <optional>
#include <string>

#include "axengine/strings.hpp"
#include "axengine/version.hpp"

namespace ax {

// nullopt when a plugin built for ABI major.minor may load into a host of host_major.host_minor; otherwise
// the refusal, naming both sides: "plugin ABI 1.3 (host: plugin ABI 1.2): a newer minor than the host's".
inline std::optional<std::string> abi_refusal(int major, int minor, int host_major = kPluginAbiMajor,
                                              int host_minor = kPluginAbiMinor) {
  const std::string both = str("plugin ABI ", major, ".", minor, " (host: plugin ABI ", host_major, ".", host_minor, ")");
  if (major != host_major) return str(both, ": another major; rebuild the plugin against this axengine");
  if (minor > host_minor) return str(both, ": a newer minor than the host's; use an axengine at least as new");
  return std::nullopt;
}

}  // namespace ax
