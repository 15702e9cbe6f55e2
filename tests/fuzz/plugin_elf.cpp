// A file on the plugin path, as discovery reads it before deciding to dlopen it: the ELF header and program
// headers checked the way the dynamic loader will use them, the "axengine_plugin" section extracted, and the
// descriptor in it parsed and compared with the host's fingerprint.
#include "axengine/descriptor.hpp"
#include "harness.hpp"

AX_FUZZ_HARNESS(plugin_elf) {
  const std::string path = ax::fuzz::scratch() + "/axengine_fuzz.so";
  ax::fuzz::write_file(path, {reinterpret_cast<const char*>(data), size});
  auto text = ax::read_descriptor_section(path);
  if (!text) return;
  ax::PluginDescriptor d = ax::parse_descriptor(*text);
  (void)d.fingerprint.mismatch(ax::host_fingerprint());
  (void)d.fingerprint.describe();
}
