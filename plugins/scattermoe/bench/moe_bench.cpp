// moe_bench: the standalone runner of the MoE expert-block benchmark (core/cli/moe_block_bench.hpp;
// the same as `axengine bench moe`), loading the plugins named on the command line.
//
//   moe_bench --plugin build/bin/plugins/axengine_scattermoe.so [--shape NAME]... [--backend NAME]...
//             [--tokens 4096] [--rank 16] [--iters 20] [--format dense|nf4|mxfp4|nvfp4] [--out results.json]
//             [--device-kind nvidia-h200] [--profile] [--tune] [--path auto|fused|split|split_gmm]
//             [--config FILE] [--set KEY=VALUE]...
// The plugins are loaded by the engine's start path, configured by the config's plugin tables and --set;
// --tune and --path are short for --set kernels.options.scattermoe.tune=true / .path=P
// (docs/plugins/scattermoe.md).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <axengine/engine.hpp>
#include <axengine/error.hpp>

#include "moe_block_bench.hpp"  // core/cli: shared with `axengine bench moe`

int main(int argc, char** argv) try {
  ax::bench::MoeBenchOptions opt;
  ax::StartOptions start;
  start.discover = false;  // only the --plugin files
  std::string out_path, kind = "unknown";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--shape") opt.shapes.push_back(next());
    else if (a == "--backend") opt.backends.push_back(next());
    else if (a == "--plugin") start.plugin_files.push_back(next());
    else if (a == "--tokens") opt.tokens = std::stoll(next());
    else if (a == "--rank") opt.rank = std::stoll(next());
    else if (a == "--iters") opt.iters = std::stoi(next());
    else if (a == "--format") opt.format = next();
    else if (a == "--out") out_path = next();
    else if (a == "--profile") opt.profile = true;
    else if (a == "--device-kind") kind = next();
    else if (a == "--tune") start.overrides.push_back("kernels.options.scattermoe.tune=true");
    else if (a == "--path") start.overrides.push_back("kernels.options.scattermoe.path=" + next());
    else if (a == "--config") start.config_file = next();
    else if (a == "--set") start.overrides.push_back(next());
    else {
      std::cerr << "moe_bench: unknown argument " << a << "\n";
      return 2;
    }
  }
  // Destroyed normally: the plugin loader never unloads a library, so no backend outlives its code.
  auto started = ax::Engine::start(start);
  ax::Engine& engine = *started;
  for (const auto& rep : engine.plugins->reports())
    std::cerr << "plugin " << rep.path << ": " << ax::to_string(rep.status) << " " << rep.reason << "\n";
  const ax::Registry& registry = engine.registry;
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  nlohmann::json rows = ax::bench::run_moe_bench(registry, opt);
  if (!out_path.empty()) {
    nlohmann::json options = {{"config", start.config_file}, {"set", start.overrides}};
    nlohmann::json doc = {{"device_kind", kind}, {"command", command}, {"floor_tflops", 790.0}, {"options", options},
                          {"rows", rows}};
    std::ofstream(out_path) << doc.dump(2) << "\n";
  }
  return 0;
} catch (const ax::UsageError& e) {  // config errors included
  std::cerr << "moe_bench: " << e.what() << "\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "moe_bench: " << e.what() << "\n";
  return 1;
}
