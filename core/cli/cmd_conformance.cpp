// axengine conformance [--plugin PATH]... [--op OP] [--backend NAME] [--device cpu|cuda] [--report FILE.xml]
//                      [--quick] [--no-discover] [--verbose] [--case-timeout S] [--config FILE] [--set K=V]...
// Certifies kernel backends against the reference (core/include/axengine/conformance.hpp). With --plugin,
// only the backends of those plugin files are tested. Plugins are loaded by the engine's start path, so
// --config / --set configure them as in a run (--set kernels.options.scattermoe.path=split).
// Exit 0: all passed; 1: a case failed; 2: usage.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "axengine/conformance.hpp"
#include "axengine/engine.hpp"
#include "axengine/strings.hpp"
#include "command.hpp"

namespace {

namespace po = boost::program_options;

// Ends the process (exit 1) when one case runs longer than the limit. A hung kernel cannot be
// interrupted in-process; this at least turns the hang into a failure that names the case.
class Watchdog {
 public:
  explicit Watchdog(double limit_s) : limit_(limit_s) {
    if (limit_ > 0) thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() { stop(); }
  void started(const std::string& name) {
    std::lock_guard lock(mu_);
    current_ = name;
    since_ = std::chrono::steady_clock::now();
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void watch() {
    std::unique_lock lock(mu_);
    while (!done_) {
      cv_.wait_for(lock, std::chrono::seconds(1));
      if (done_ || current_.empty()) continue;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count() > limit_) {
        std::cerr << "FAIL (hang) " << current_ << "\n     did not finish within " << limit_
                  << " s (--case-timeout); the run is aborted\n" << std::flush;
        std::_Exit(ax::kExitRuntime);
      }
    }
  }
  double limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string current_;
  std::chrono::steady_clock::time_point since_;
  bool done_ = false;
  std::thread thread_;
};

int run_conformance(const std::vector<std::string>& args) {
  po::options_description opts("conformance options");
  opts.add_options()
      ("plugin", po::value<std::vector<std::string>>()->composing(), "plugin .so to load and certify (repeatable)")
      ("op", po::value<std::string>(), "only this op: id or config key (core's: moe.experts, dequant, norm_rope, attention, linear.lora; "
                                            "and those the loaded plugins define)")
      ("backend", po::value<std::string>(), "only this backend name")
      ("device", po::value<std::string>(), "only this device: cpu or cuda")
      ("report", po::value<std::string>(), "write JUnit XML here")
      ("quick", "the CI grid: fewer random shapes, every edge case")
      ("no-discover", "load only the --plugin files (no search of AXENGINE_PLUGIN_PATH / <exe dir>/plugins)")
      ("config,c", po::value<std::string>(), "run config whose plugin tables configure the backends ([kernels.options.*])")
      ("set", po::value<std::vector<std::string>>()->composing(), "override a config key: --set kernels.options.scattermoe.path=split")
      ("verbose,v", "list skipped cases and print each failure as it happens")
      ("case-timeout", po::value<double>()->default_value(600), "seconds one case may take before the run is "
                                                                  "declared hung (exit 1, naming the case); 0: no limit");
  po::variables_map vm;
  const std::string usage =
      "axengine conformance [--plugin PATH]... [--op OP] [--backend NAME] [--device cpu|cuda] [--report FILE.xml] [--quick]";
  if (!ax::cli::parse_options(usage, args, opts, vm)) return 0;

  ax::StartOptions start;
  if (vm.count("config")) start.config_file = vm["config"].as<std::string>();
  if (vm.count("set")) start.overrides = vm["set"].as<std::vector<std::string>>();
  // Explicit files first: they are what is being certified, and a discovered copy must not shadow them.
  if (vm.count("plugin")) start.plugin_files = vm["plugin"].as<std::vector<std::string>>();
  start.discover = !vm.count("no-discover");
  auto engine = ax::Engine::start(start);
  ax::Registry& registry = engine->registry;
  ax::conformance::Options o;
  for (const auto& r : engine->plugins->reports()) {
    if (r.origin != "command line") continue;
    if (r.status != ax::PluginReport::Status::loaded)
      throw ax::UsageError(ax::str("conformance: --plugin ", r.path, " was ", ax::to_string(r.status), ": ", r.reason));
    if (!r.reason.empty()) std::cerr << "conformance: " << r.path << ": " << r.reason << "\n";
    o.plugins.push_back(r.name);
  }
  if (vm.count("op")) o.op = vm["op"].as<std::string>();
  if (vm.count("backend")) o.backend = vm["backend"].as<std::string>();
  if (vm.count("device")) o.device = vm["device"].as<std::string>();
  o.quick = vm.count("quick") > 0;
  const bool verbose = vm.count("verbose") > 0;
  // Opened before the run so that an unwritable path is a usage error, not an hour later.
  std::ofstream xml;
  if (vm.count("report")) {
    xml.open(vm["report"].as<std::string>());
    if (!xml) throw ax::UsageError("conformance: cannot write --report " + vm["report"].as<std::string>());
  }
  if (verbose)
    o.on_case = [](const ax::conformance::CaseResult& c) {
      if (c.status == ax::conformance::Status::fail)
        std::cerr << "FAIL " << c.backend << " on " << c.device << ": " << c.name << "\n     " << c.message << "\n";
    };

  // A backend that hangs on some input must not hang CI: a watchdog names the case and ends the run.
  Watchdog watchdog(vm["case-timeout"].as<double>());
  o.on_start = [&](const std::string& name) { watchdog.started(name); };
  ax::conformance::Report report = ax::conformance::run(registry, o);
  watchdog.stop();
  ax::conformance::print_summary(report, std::cout, verbose);
  if (xml.is_open()) {
    ax::conformance::write_junit(report, xml);
    xml.close();
    if (!xml) throw ax::RuntimeError("conformance: failed writing " + vm["report"].as<std::string>());
  }
  return report.ok() ? ax::kExitOk : ax::kExitRuntime;
}

ax::cli::CommandRegistrar reg({"conformance", "certify kernel backends (and plugins) against the reference", run_conformance});

}  // namespace
