// axengine plugins list [--config FILE] | plugins explain --config FILE
#include <iostream>

#include "axengine/engine.hpp"
#include "axengine/op_spec.hpp"
#include "axengine/strings.hpp"
#include "axengine/training.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;

void print_reports(const ax::PluginLoader& loader, const ax::Registry& registry) {
  const auto& reports = loader.reports();
  std::cout << "plugins (" << reports.size() << " files examined; search order: config plugins.paths, "
            << "AXENGINE_PLUGIN_PATH, <exe dir>/plugins)\n";
  for (const auto& r : reports) {
    std::cout << "  [" << ax::to_string(r.status) << "] " << (r.name.empty() ? "-" : r.name)
              << (r.version.empty() ? "" : " " + r.version) << "  " << r.path << "  (via " << r.origin << ")\n";
    if (!r.reason.empty()) std::cout << "      " << r.reason << "\n";
    for (const auto& key : r.providers) std::cout << "      provides " << key << "\n";
    for (const auto& table : r.config_tables) std::cout << "      config table [" << table << "]\n";
  }
  std::cout << "providers:\n";
  for (const auto& p : registry.all()) {
    // An op is data (op_spec.hpp), not a backend: show its config key instead of requirements.
    const std::string what = p.info.kind == ax::ProviderKind::op
                                 ? "(config key " + registry.op(p.info.name)->config_key + ")"
                                 : "[" + p.info.needs.describe() + "]";
    std::cout << "  " << p.info.key() << "  " << what << (p.info.graph_safe ? "  graph-safe" : "") << "  from "
              << p.info.plugin << "\n";
  }
}

int run_plugins(const std::vector<std::string>& args) {
  const std::string usage = "axengine plugins list [--config FILE] | axengine plugins explain --config FILE";
  if (args.empty() || (args[0] != "list" && args[0] != "explain")) {
    if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
      std::cout << "usage: " << usage << "\n  list     plugins found, their providers, why any was refused\n"
                << "  explain  op -> chosen backend for each call the config's model makes (every op without\n"
                << "           [model] path) on the config's device, and why others were passed over\n";
      return 0;
    }
    throw ax::UsageError("plugins: expected 'list' or 'explain' (usage: " + usage + ")");
  }
  const std::string sub = args[0];
  po::options_description opts("plugins " + sub + " options");
  opts.add_options()("config,c", po::value<std::string>(), "run config (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a config key");
  po::variables_map vm;
  if (!ax::cli::parse_options("axengine plugins " + sub + " [--config FILE]", {args.begin() + 1, args.end()}, opts, vm))
    return 0;
  auto sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (sub == "explain") {
    if (!vm.count("config")) throw ax::UsageError("plugins explain: --config FILE is required");
    auto engine = ax::Engine::start(vm["config"].as<std::string>(), sets);
    std::cout << ax::explain_kernels(*engine);
    return 0;
  }
  ax::StartOptions start;  // without --config: every default (and the --set overrides)
  if (vm.count("config")) start.config_file = vm["config"].as<std::string>();
  start.overrides = sets;
  auto engine = ax::Engine::start(start);
  print_reports(*engine->plugins, engine->registry);
  return 0;
}

ax::cli::CommandRegistrar reg({"plugins", "list plugins, or explain the kernel backend chosen per op", run_plugins});

}  // namespace
