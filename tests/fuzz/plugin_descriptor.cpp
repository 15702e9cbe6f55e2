// The descriptor text a plugin carries in its "axengine_plugin" section (JSON: ABI, build fingerprint, the
// providers it declares and their requirements), parsed as the loader does before loading anything.
#include "axengine/descriptor.hpp"
#include "harness.hpp"

AX_FUZZ_HARNESS(plugin_descriptor) {
  ax::PluginDescriptor d = ax::parse_descriptor(std::string(reinterpret_cast<const char*>(data), size));
  (void)d.fingerprint.mismatch(ax::host_fingerprint());
  (void)d.fingerprint.describe();
}
