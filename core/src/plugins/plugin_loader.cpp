#include "axengine/plugin_loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include "axengine/descriptor.hpp"
#include "axengine/log.hpp"
#include "axengine/plugin.hpp"
#include "axengine/strings.hpp"
#include "plugins/abi_rule.hpp"

namespace fs = std::filesystem;

namespace ax {

const char* to_string(PluginReport::Status s) {
  switch (s) {
    case PluginReport::Status::loaded: return "loaded";
    case PluginReport::Status::refused: return "refused";
    case PluginReport::Status::skipped: return "skipped";
  }
  return "?";
}

struct PluginLoader::Loaded {
  boost::dll::shared_library library;
};

PluginLoader::PluginLoader(Registry& registry) : registry_(registry) {}
// Libraries are never unloaded: provider objects in the registry (which may outlive the loader), static
// destructors and atexit handlers still point into their code. Each is pinned in memory (RTLD_NODELETE) and
// its handle then closed, so nothing is leaked either (LeakSanitizer holds the sanitized suite to that); a
// library that cannot be pinned keeps its handle open instead.
PluginLoader::~PluginLoader() {
  for (auto& l : libraries_) {
    void* pin = nullptr;
    try {
      pin = ::dlopen(l->library.location().c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    } catch (const std::exception&) {
    }
    if (!pin) {
      (void)l.release();
      continue;
    }
    ::dlclose(pin);  // the extra reference; RTLD_NODELETE stays with the library
  }
}

namespace {

std::string canonical_or_same(const std::string& path) {
  std::error_code ec;
  auto c = fs::weakly_canonical(path, ec);
  return ec ? path : c.string();
}

// Registers what the plugin staged, keeping only providers its descriptor declares (their requirements
// come from there). Returns notes about providers that were not kept.
std::vector<std::string> commit(Registry& registry, const PluginDescriptor& d, const std::string& path,
                                const PluginRegistrar& reg, std::vector<std::string>& added) {
  std::vector<std::string> notes;
  // Ops first: the plugin's kernels of an op it defines need the op registered.
  std::vector<const PluginRegistrar::Staged*> order;
  for (const auto& s : reg.staged())
    if (s.kind == ProviderKind::op) order.push_back(&s);
  for (const auto& s : reg.staged())
    if (s.kind != ProviderKind::op) order.push_back(&s);
  for (const auto* staged : order) {
    const auto& s = *staged;
    ProviderInfo info;
    info.kind = s.kind;
    info.op = s.op;
    info.name = s.name;
    info.plugin = d.name;
    info.origin = path;
    auto decl = std::find_if(d.providers.begin(), d.providers.end(), [&](const auto& p) {
      return p.kind == s.kind && p.name == s.name && (s.kind != ProviderKind::kernel || p.op == s.op);
    });
    if (decl == d.providers.end()) {
      notes.push_back(str(info.key(), " is registered but not declared in the descriptor; ignored"));
      continue;
    }
    info.needs = decl->needs;
    info.summary = decl->summary;
    info.graph_safe = decl->graph_safe;
    try {
      registry.add({info, s.object});
      added.push_back(info.key());
    } catch (const UsageError& e) {
      notes.push_back(str(e.what(), "; ignored"));
    }
  }
  for (const auto& p : d.providers) {
    ProviderInfo info{p.kind, p.op, p.name};
    if (std::find(added.begin(), added.end(), info.key()) == added.end() &&
        std::none_of(notes.begin(), notes.end(), [&](auto& n) { return n.find(info.key()) != std::string::npos; }))
      notes.push_back(str(info.key(), " is declared but was not registered"));
  }
  return notes;
}

// Keeps the config tables the plugin declared that it may own: [kernels.options.<backend>] of a backend it
// registered (`added` holds the keys committed above), or [<plugin name>]. Returns notes on the others.
std::vector<std::string> commit_tables(const PluginDescriptor& d, const PluginRegistrar& reg,
                                       const std::vector<std::string>& added, std::vector<PluginConfigTable>& tables,
                                       std::vector<std::string>& owned) {
  std::vector<std::string> notes;
  const std::string prefix = "kernels.options.";
  for (const auto& t : reg.config_tables()) {
    bool allowed = t.path == d.name;
    if (t.path.rfind(prefix, 0) == 0) {
      const std::string backend = t.path.substr(prefix.size());
      allowed = std::any_of(added.begin(), added.end(), [&](const std::string& key) {
        return key.rfind("kernel ", 0) == 0 && key.size() > backend.size() + 1 &&
               key.compare(key.size() - backend.size() - 1, std::string::npos, "/" + backend) == 0;
      });
    }
    if (!allowed) {
      notes.push_back(str("config table [", t.path, "] is neither [kernels.options.<a backend it registers>] nor [",
                          d.name, "]; ignored"));
      continue;
    }
    auto prev = std::find_if(tables.begin(), tables.end(), [&](const PluginConfigTable& o) { return o.path == t.path; });
    if (prev != tables.end()) {
      notes.push_back(str("config table [", t.path, "] is already owned by plugin '", prev->plugin, "'; ignored"));
      continue;
    }
    PluginConfigTable kept = t;
    kept.plugin = d.name;
    tables.push_back(std::move(kept));
    owned.push_back(t.path);
  }
  return notes;
}

}  // namespace

const PluginReport& PluginLoader::load_file(const std::string& path_in, const std::string& origin) {
  const std::string path = canonical_or_same(path_in);
  PluginReport r;
  r.path = path;
  r.origin = origin;
  auto finish = [&](PluginReport::Status status, std::string reason) -> const PluginReport& {
    r.status = status;
    r.reason = std::move(reason);
    if (status == PluginReport::Status::refused)
      log::warn(str("plugin refused: ", r.name.empty() ? "" : str("'", r.name, "' "), path, ": ", r.reason));
    else if (status == PluginReport::Status::skipped)
      log::debug(str("plugin skipped: ", path, ": ", r.reason));
    else
      log::debug(str("plugin loaded: '", r.name, "' ", r.version, " from ", path, " (", origin, ")"));
    reports_.push_back(std::move(r));
    return reports_.back();
  };

  for (const auto& prev : reports_)
    if (prev.path == path && prev.status == PluginReport::Status::loaded)
      return finish(PluginReport::Status::skipped, str("already loaded (found via ", prev.origin, ")"));

  // 1. Read the descriptor from the file; nothing of the plugin runs yet.
  std::optional<std::string> text;
  try {
    text = read_descriptor_section(path);
  } catch (const std::exception& e) {
    return finish(PluginReport::Status::refused, str("unreadable: ", e.what()));
  }
  if (!text) return finish(PluginReport::Status::skipped, "not an axengine plugin (no 'axengine_plugin' section)");
  PluginDescriptor d;
  try {
    d = parse_descriptor(*text);
  } catch (const std::exception& e) {
    return finish(PluginReport::Status::refused, e.what());
  }
  r.name = d.name;
  r.version = d.version;

  // 2. Compatibility: same ABI major, a minor no newer than ours, the same build fingerprint.
  if (auto why = abi_refusal(d.abi_major, d.abi_minor)) return finish(PluginReport::Status::refused, *why);
  if (auto why = d.fingerprint.mismatch(host_fingerprint()))
    return finish(PluginReport::Status::refused, str("built with ", *why));
  for (const auto& prev : reports_)
    if (prev.status == PluginReport::Status::loaded && prev.name == d.name)
      return finish(PluginReport::Status::refused, str("a plugin named '", d.name, "' is already loaded from ", prev.path));

  // 3. Load and register. A throwing registration keeps nothing it staged.
  auto loaded = std::make_unique<Loaded>();
  try {
    loaded->library.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    return finish(PluginReport::Status::refused, str("cannot load: ", e.what()));
  }
  if (!loaded->library.has("axengine_plugin_register"))
    return finish(PluginReport::Status::refused, "has a descriptor but no axengine_plugin_register entry point");
  PluginRegistrar registrar;
  try {
    loaded->library.get<PluginRegisterFn>("axengine_plugin_register")(registrar);
  } catch (const std::exception& e) {
    libraries_.push_back(std::move(loaded));  // its code may still be referenced (e.g. atexit); keep it
    return finish(PluginReport::Status::refused, str("registration threw: ", e.what()));
  } catch (...) {
    libraries_.push_back(std::move(loaded));
    return finish(PluginReport::Status::refused, "registration threw a non-standard exception");
  }
  libraries_.push_back(std::move(loaded));
  auto notes = commit(registry_, d, path, registrar, r.providers);
  for (auto& n : commit_tables(d, registrar, r.providers, tables_, r.config_tables)) notes.push_back(std::move(n));
  for (const auto& n : notes) log::warn(str("plugin '", d.name, "' (", path, "): ", n));
  return finish(PluginReport::Status::loaded, join(notes, "; "));
}

void PluginLoader::discover(const std::vector<std::string>& config_paths, const std::string& exe_dir) {
  auto scan = [&](const std::string& entry, const std::string& origin) {
    std::error_code ec;
    if (fs::is_directory(entry, ec)) {
      std::vector<std::string> files;
      for (const auto& f : fs::directory_iterator(entry, ec))
        if (f.path().extension() == ".so" && !fs::is_directory(f.path(), ec)) files.push_back(f.path().string());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) load_file(f, origin);
    } else if (fs::exists(entry, ec)) {
      load_file(entry, origin);
    } else {
      PluginReport r;
      r.path = entry;
      r.origin = origin;
      r.status = PluginReport::Status::skipped;
      r.reason = "no such file or directory";
      log::warn(str("plugin path ", entry, " (", origin, "): no such file or directory"));
      reports_.push_back(std::move(r));
    }
  };
  for (const auto& p : config_paths) scan(p, "config plugins.paths");
  if (const char* env = std::getenv("AXENGINE_PLUGIN_PATH")) {
    std::string all = env;
    for (std::size_t start = 0; start <= all.size();) {
      std::size_t end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      if (end > start) scan(all.substr(start, end - start), "AXENGINE_PLUGIN_PATH");
      start = end + 1;
    }
  }
  fs::path dir = exe_dir.empty() ? fs::path(boost::dll::program_location().parent_path().string()) : fs::path(exe_dir);
  std::error_code ec;
  if (fs::is_directory(dir / "plugins", ec)) scan((dir / "plugins").string(), "executable dir");
}

}  // namespace ax
