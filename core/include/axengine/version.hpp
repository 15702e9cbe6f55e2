// axengine version and the plugin ABI version.
//
// The plugin ABI is what a plugin .so and the host must agree on: the layout of the descriptor, the
// registration entry point and every interface in core/include/axengine. A change that breaks existing
// plugins bumps the major; a backwards-compatible addition bumps the minor. The loader accepts a plugin
// whose ABI major equals the host's and whose minor is not newer than the host's.
#pragma once

#define AXENGINE_VERSION_STRING "0.1.0"
#define AXENGINE_PLUGIN_ABI_MAJOR 1
#define AXENGINE_PLUGIN_ABI_MINOR 0

namespace ax {
inline constexpr const char* kVersion = AXENGINE_VERSION_STRING;
inline constexpr int kPluginAbiMajor = AXENGINE_PLUGIN_ABI_MAJOR;
inline constexpr int kPluginAbiMinor = AXENGINE_PLUGIN_ABI_MINOR;
}  // namespace ax
