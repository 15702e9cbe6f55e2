// moe_bench: the standalone runner of the MoE expert-block benchmark (core/cli/moe_block_bench.hpp;
// the same as `axengine bench moe`), loading the plugins named on the command line.
//
//   moe_bench --plugin build/bin/plugins/axengine_scattermoe.so [--shape NAME]... [--backend NAME]...
//             [--tokens 4096] [--rank 16] [--iters 20] [--format dense|nf4|mxfp4|nvfp4] [--out results.json]
//             [--device-kind nvidia-h200] [--profile] [--tune] [--path auto|fused|split|split_gmm]
// --tune and --path set AXENGINE_SCATTERMOE_TUNE=1 / AXENGINE_SCATTERMOE_PATH for this process (the
// scattermoe plugin reads them on its first call; docs/plugins/scattermoe.md).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <axengine/builtins.hpp>
#include <axengine/plugin_loader.hpp>
#include <axengine/registry.hpp>

#include "../core/cli/moe_block_bench.hpp"

int main(int argc, char** argv) try {
  ax::bench::MoeBenchOptions opt;
  std::vector<std::string> plugins;
  std::string out_path, kind = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--shape") opt.shapes.push_back(next());
    else if (a == "--backend") opt.backends.push_back(next());
    else if (a == "--plugin") plugins.push_back(next());
    else if (a == "--tokens") opt.tokens = std::stoll(next());
    else if (a == "--rank") opt.rank = std::stoll(next());
    else if (a == "--iters") opt.iters = std::stoi(next());
    else if (a == "--format") opt.format = next();
    else if (a == "--out") out_path = next();
    else if (a == "--profile") opt.profile = true;
    else if (a == "--device-kind") kind = next();
    else if (a == "--tune") ::setenv("AXENGINE_SCATTERMOE_TUNE", "1", 1);
    else if (a == "--path") ::setenv("AXENGINE_SCATTERMOE_PATH", next().c_str(), 1);
    else {
      std::cerr << "moe_bench: unknown argument " << a << "\n";
      return 2;
    }
  }
  // Leaked on purpose: plugins stay loaded for the process' life, and the registry's backend objects
  // must not be destroyed after their library is gone.
  ax::Registry& registry = *new ax::Registry;
  ax::register_builtins(registry);
  ax::PluginLoader& loader = *new ax::PluginLoader(registry);
  for (const auto& p : plugins) {
    const auto& rep = loader.load_file(p, "command line");
    std::cerr << "plugin " << p << ": " << ax::to_string(rep.status) << " " << rep.reason << "\n";
  }
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  nlohmann::json rows = ax::bench::run_moe_bench(registry, opt);
  if (!out_path.empty()) {
    nlohmann::json env = nlohmann::json::object();
    for (const char* name : {"AXENGINE_SCATTERMOE_PATH", "AXENGINE_SCATTERMOE_TUNE", "AXENGINE_TUNING_CACHE"})
      if (const char* v = std::getenv(name)) env[name] = v;
    nlohmann::json doc = {{"device_kind", kind}, {"command", command}, {"floor_tflops", 790.0}, {"env", env},
                          {"rows", rows}};
    std::ofstream(out_path) << doc.dump(2) << "\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "moe_bench: " << e.what() << "\n";
  return 1;
}
