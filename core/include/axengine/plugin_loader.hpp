// Plugin discovery and loading.
//
// Search order: config `plugins.paths`, then AXENGINE_PLUGIN_PATH (':'-separated), then the directory
// beside the executable (<exe dir>/plugins). Entries may be directories (every *.so in them, in name
// order) or files. Each file is checked WITHOUT running its code: a non-regular file (a FIFO named x.so)
// is refused without being opened; the ELF and program headers are checked against the file (a file that
// would fault inside dlopen is refused); its "axengine_plugin" ELF section is read and parsed against the
// descriptor schema; a plugin whose ABI major (or a newer minor) or build fingerprint differs from the
// host's is refused with one line naming both sides. Only then is it loaded (Boost.DLL) and its
// axengine_plugin_register called; if that throws, nothing it registered is kept. A bad file never
// stops the others.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "axengine/config_binder.hpp"
#include "axengine/registry.hpp"

namespace ax {

struct PluginDescriptor;

struct PluginReport {
  enum class Status { loaded, refused, skipped };
  std::string path;
  std::string origin;  // "config plugins.paths", "AXENGINE_PLUGIN_PATH", "executable dir", "command line"
  Status status = Status::skipped;
  std::string name, version;  // from the descriptor, when it could be read
  std::string reason;         // why refused or skipped; for loaded plugins, notes (e.g. a provider refused)
  std::vector<std::string> providers;  // keys of the providers it added
  std::vector<std::string> config_tables;  // the config tables it owns: "kernels.options.scattermoe"
};
const char* to_string(PluginReport::Status status);

class PluginLoader {
 public:
  explicit PluginLoader(Registry& registry);
  ~PluginLoader();
  PluginLoader(const PluginLoader&) = delete;
  PluginLoader& operator=(const PluginLoader&) = delete;

  // Loads one file. Never throws for a bad plugin: the report says what happened.
  const PluginReport& load_file(const std::string& path, const std::string& origin);
  // Walks the search order above. `exe_dir` empty: the running executable's directory.
  void discover(const std::vector<std::string>& config_paths, const std::string& exe_dir = "");

  const std::vector<PluginReport>& reports() const { return reports_; }
  // The config tables the loaded plugins declared (PluginRegistrar::backend_options / config_table), for
  // bind_config. A table is kept only when it is the options of a backend its plugin registered, or the
  // top-level table named after the plugin, and no earlier plugin owns its path.
  const std::vector<PluginConfigTable>& config_tables() const { return tables_; }

 private:
  struct Loaded;
  Registry& registry_;
  std::vector<PluginReport> reports_;
  std::vector<PluginConfigTable> tables_;
  std::vector<std::unique_ptr<Loaded>> libraries_;  // kept loaded for the process' life
};

}  // namespace ax
