// A plugin's descriptor, as read from its file without loading it (see plugin.hpp for how a plugin
// declares it and plugin_loader.hpp for when it is checked).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "axengine/registry.hpp"

namespace ax {

struct BuildFingerprint {
  std::string torch;      // "2.11.0"
  std::string cuda;       // CUDA version LibTorch was built with, "13.0", or "none"
  std::string compiler;   // "gcc 12"
  std::string cxx11_abi;  // "1"
  // The first field that differs, as "torch 1.13.0 (host 2.11.0)"; nullopt when compatible.
  std::optional<std::string> mismatch(const BuildFingerprint& host) const;
  std::string describe() const;
};

struct PluginDescriptor {
  int abi_major = 0, abi_minor = 0;
  BuildFingerprint fingerprint;
  std::string name, version;
  struct Declared {
    ProviderKind kind;
    std::string op, name, summary;
    Requirements needs;
    bool graph_safe = false;  // kernels: "graph_safe": true
  };
  std::vector<Declared> providers;
};

// The host's own fingerprint and ABI (the same macros plugins use, compiled into the core).
const BuildFingerprint& host_fingerprint();

// Reads the raw descriptor text from the "axengine_plugin" ELF section of `path` without loading it, after
// checking the ELF header and program headers the way the dynamic loader will use them (every segment
// inside the file, load segments sorted and disjoint, PT_DYNAMIC inside a load segment...), so that a file
// dlopen would fault on is refused here instead.
// nullopt: the file is an ELF shared object without that section (not an axengine plugin).
// Throws UsageError for a path that is not a regular file (a FIFO is refused, never opened) and
// RuntimeError naming the problem for a file that is not a readable, loadable ELF shared object
// (truncated, garbage, broken program headers).
std::optional<std::string> read_descriptor_section(const std::string& path);

// Parses descriptor text. Throws UsageError naming the field on malformed input.
PluginDescriptor parse_descriptor(const std::string& text);

}  // namespace ax
