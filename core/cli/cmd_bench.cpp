// axengine bench moe [--shape NAME]... [--backend NAME]... [--tokens N] [--rank R] [--iters N] [--format F]
//                    [--out FILE] [--config FILE] [--set KEY=VALUE]...
// Runs the MoE expert-block comparison (moe_block_bench.hpp) with the plugins found the usual way
// (AXENGINE_PLUGIN_PATH, <exe dir>/plugins), so anyone can reproduce bench/results/moe-*.json. The engine's
// start path loads them, so a config's plugin tables (or --set kernels.options.scattermoe.tune=true)
// configure the backends as in a run.
#include <fstream>
#include <iostream>

#include "axengine/bench_result.hpp"
#include "axengine/engine.hpp"
#include "axengine/error.hpp"
#include "axengine/strings.hpp"
#include "command.hpp"
#include "moe_block_bench.hpp"

namespace {

namespace po = boost::program_options;

int run_bench(const std::vector<std::string>& args) {
  const std::string usage =
      "axengine bench moe [--shape NAME]... [--backend NAME]... [--tokens N] [--rank R] [--iters N] [--format F] "
      "[--device cuda|cpu] [--out FILE] [--profile] [--config FILE] [--set KEY=VALUE]...";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    if (args.empty()) throw ax::UsageError("bench: expected a benchmark name: moe (usage: " + usage + ")");
    std::cout << "usage: " << usage << "\n  moe   the MoE expert block (gate_up, SiLU·up or gpt-oss's clamped GLU, down with gates, LoRA), "
              << "forward + backward,\n        through moe.experts backends, moe.mlp backends (mlp:NAME) and at::_grouped_mm\n";
    return 0;
  }
  if (args[0] != "moe") throw ax::UsageError("bench: unknown benchmark '" + args[0] + "' (known: moe)");
  po::options_description opts("bench moe options");
  opts.add_options()("shape", po::value<std::vector<std::string>>()->composing(),
                     ("shape (repeatable; default all): " + ax::join(ax::bench::moe_bench_shapes(), ", ")).c_str())(
      "backend", po::value<std::vector<std::string>>()->composing(),
      "grouped_mm, a moe.experts backend, or mlp:NAME for moe.mlp backend NAME (repeatable; default grouped_mm, "
      "scattermoe, mlp:sonicmoe, mlp:scattermoe, reference)")(
      "tokens", po::value<int64_t>()->default_value(4096), "tokens T")(
      "rank", po::value<int64_t>()->default_value(16), "LoRA rank")(
      "iters", po::value<int>()->default_value(20), "timed calls per series (medians of a rested and a back-to-back series)")(
      "format", po::value<std::string>()->default_value("dense"),
      "expert weights of the moe.experts backends: dense, nf4, mxfp4, nvfp4")(
      "device", po::value<std::string>()->default_value("cuda"),
      "cuda (bf16, event timing) or cpu (fp32, wall clock: a smoke run, e.g. --shape tiny-gpt-oss)")(
      "out", po::value<std::string>(), "write the rows as JSON to FILE")(
      "profile", "after timing each backend, profile 3 iterations and print its GPU kernels by time")(
      "config,c", po::value<std::string>(), "run config whose plugin tables configure the backends ([kernels.options.*])")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a config key: --set kernels.options.scattermoe.tile=128x128 (docs/plugins/scattermoe.md)");
  po::variables_map vm;
  if (!ax::cli::parse_options(usage, {args.begin() + 1, args.end()}, opts, vm)) return 0;
  ax::bench::MoeBenchOptions o;
  if (vm.count("shape")) o.shapes = vm["shape"].as<std::vector<std::string>>();
  if (vm.count("backend")) o.backends = vm["backend"].as<std::vector<std::string>>();
  o.tokens = vm["tokens"].as<int64_t>();
  o.rank = vm["rank"].as<int64_t>();
  o.iters = vm["iters"].as<int>();
  o.profile = vm.count("profile") > 0;
  o.format = vm["format"].as<std::string>();
  o.device = vm["device"].as<std::string>();

  ax::StartOptions start;
  if (vm.count("config")) start.config_file = vm["config"].as<std::string>();
  if (vm.count("set")) start.overrides = vm["set"].as<std::vector<std::string>>();
  // Destroyed normally: the plugin loader never unloads a library, so no backend outlives its code.
  auto started = ax::Engine::start(start);
  ax::Engine& engine = *started;
  nlohmann::json rows = ax::bench::run_moe_bench(engine.registry, o);
  if (vm.count("out")) {
    std::string command = "axengine bench";
    for (const auto& a : args) command += " " + a;
    const std::string path = vm["out"].as<std::string>();
    std::ofstream f(path);
    if (!f) throw ax::UsageError("bench moe: cannot write --out " + path);
    // Where, when and how, inside the file (docs/performance.md, "Citing results").
    const std::string device = o.device == "cuda" && engine.device.is_cuda() ? engine.device.name : "cpu";
    f << nlohmann::json{{"device", device}, {"date", ax::utc_date_today()}, {"command", command}, {"floor_tflops", 790.0}, {"rows", rows}}.dump(2)
      << "\n";
  }
  return 0;
}

ax::cli::CommandRegistrar reg({"bench", "benchmarks: `bench moe` compares moe.experts backends on the MoE expert block",
                               run_bench});

}  // namespace
