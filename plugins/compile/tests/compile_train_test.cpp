// The built compile plugin in a run: loaded into a registry, its [compile] table bound with the config, its
// executor chosen by the trainer. CPU: selection, the fallback reason, and static_shapes' exact padding (the
// losses of a run equal bit for bit those without the plugin). GPU (skipped without one): a graphed run
// against an eager one through the CLI.
#include <ATen/ATen.h>  // before doctest: c10 defines a CHECK of its own, doctest's must win
#include <doctest/doctest.h>

#include <axengine/executor.hpp>
#include <axengine/plugin_loader.hpp>

#include "unit/cli_util.hpp"
#include "unit/train_harness.hpp"

namespace fs = std::filesystem;

namespace {

std::string plugin_path() { return std::string(AXENGINE_PLUGIN_DIR) + "/axengine_compile.so"; }

// The harness's run with the plugin loaded and `sets` ("compile.enabled=true", ...) bound as the engine binds them.
struct PluginRun {
  ax::test::Harness h;
  std::unique_ptr<ax::PluginLoader> loader;
  PluginRun(const fs::path& dir, const std::vector<std::string>& sets) : h(dir) {
    loader = std::make_unique<ax::PluginLoader>(h.reg);
    const ax::PluginReport& r = loader->load_file(plugin_path(), "compile test");
    REQUIRE_MESSAGE(r.status == ax::PluginReport::Status::loaded, r.reason);
    h.cfg = ax::read_config((dir / "run.toml").string(), sets);
    ax::bind_config(h.cfg, loader->config_tables());
  }
};

ax::ExecutorContext cpu_context(const ax::Registry& reg) {
  ax::ExecutorContext ctx;
  ctx.registry = &reg;
  return ctx;
}

}  // namespace

TEST_CASE("compile: the executor is the plugin's only when [compile] is enabled; two wanting a run are refused") {
  auto dir = ax::test::make_run_dir("compile_select", "");
  {
    PluginRun off(dir, {});
    CHECK(ax::select_executor(off.h.reg, cpu_context(off.h.reg))->name() == "eager");
  }
  PluginRun on(dir, {"compile.enabled=true", "compile.tf32=false"});
  auto e = ax::select_executor(on.h.reg, cpu_context(on.h.reg));
  CHECK(e->name() == "compile (eager)");
  CHECK(e->fallback_reason() == "");

  struct Greedy final : ax::ExecutorProvider {
    std::unique_ptr<ax::StepExecutor> create(const ax::ExecutorContext&) const override {
      return std::make_unique<ax::EagerExecutor>();
    }
  };
  ax::Provider p;
  p.info.kind = ax::ProviderKind::executor;
  p.info.name = "greedy";
  p.info.plugin = "other";
  p.info.origin = "other.so";
  p.object = std::make_shared<Greedy>();
  on.h.reg.add(std::move(p));
  CHECK_THROWS_WITH_AS(ax::select_executor(on.h.reg, cpu_context(on.h.reg)),
                       doctest::Contains("two step executors want this run"), ax::UsageError);
}

TEST_CASE("compile: [compile] is refused where the plugin is not loaded, and validated where it is") {
  auto dir = ax::test::make_run_dir("compile_unloaded", "");
  CHECK_THROWS_AS(ax::load_config((dir / "run.toml").string(), {"compile.enabled=true"}), ax::ConfigError);
  ax::Registry reg;
  ax::PluginLoader loader(reg);
  REQUIRE(loader.load_file(plugin_path(), "compile test").status == ax::PluginReport::Status::loaded);
  ax::RunConfig cfg = ax::read_config((dir / "run.toml").string(), {"compile.cuda_graphs=true"});
  CHECK_THROWS_WITH_AS(ax::bind_config(cfg, loader.config_tables()),
                       doctest::Contains("compile.cuda_graphs is set while compile.enabled = false"), ax::ConfigError);
}

TEST_CASE("compile: on the CPU cuda_graphs declines with one reason, the run continues eagerly and static_shapes' padding is exact") {
  auto dir = ax::test::make_run_dir("compile_cpu_run", "");
  ax::test::Harness plain(dir);
  const std::vector<double> want = plain.run().losses;
  REQUIRE(want.size() == 12);

  // A fresh output dir: the same run, with [compile] graphs + static shapes (declined on the CPU: eager).
  PluginRun graphed(dir, {"compile.enabled=true", "compile.cuda_graphs=true", "compile.static_shapes=true",
                          "run.output_dir=\"out_compile\""});
  ax::ExecutorContext ctx = cpu_context(graphed.h.reg);
  auto e = ax::select_executor(graphed.h.reg, ctx);
  CHECK(e->fallback_reason() == "CUDA graphs need a CUDA device; this run is on cpu");
  CHECK(e->static_shapes());
  const std::vector<double> got = graphed.h.run().losses;
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == want[i]);  // bitwise: empty spans carry no token and no loss
  }
}

namespace {

// The loss of every step of a CLI run in `dir` with `extra` appended to its run.toml.
std::vector<double> cli_losses(const fs::path& dir, const std::string& out, const std::vector<std::string>& sets,
                               std::string& log_text) {
  std::vector<std::string> args{"run", "--config", (dir / "run.toml").string(), "--set", "run.output_dir=\"" + out + "\""};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  const fs::path log = dir / (out + ".log");
  const int rc = ax::test::run(args, log);
  log_text = ax::test::slurp(log);
  REQUIRE_MESSAGE(rc == 0, log_text);
  std::vector<double> losses;
  for (const auto& r : ax::test::step_records(dir / out / "metrics.jsonl")) losses.push_back(r["loss"].get<double>());
  return losses;
}

bool no_cuda() {
  if (at::hasCUDA()) return false;
  MESSAGE("no CUDA device: the graphed runs need one");
  return true;
}

}  // namespace

// GPU: 50 steps of a tiny Llama LoRA, packed rows. The graphed run reads its learning rate from a float32
// device scalar, the eager one passes a double: the updates may differ in the last bits, so eager vs graphed
// is held to a tolerance; two graphed runs with deterministic = true must agree bit for bit.
TEST_CASE("compile: GPU: a graphed run gives the eager run's losses, and repeats itself bitwise") {
  if (no_cuda()) return;
  auto dir = ax::test::setup_run("compile_gpu_graphs", "max_steps = 50\n");
  std::string log_eager, log_graph, log_graph2;
  const std::vector<double> eager = cli_losses(dir, "eager", {}, log_eager);
  const std::vector<std::string> graphs{"compile.enabled=true", "compile.cuda_graphs=true", "compile.static_shapes=true",
                                        "compile.deterministic=true"};
  const std::vector<double> graphed = cli_losses(dir, "graphed", graphs, log_graph);
  CHECK(log_graph.find("captured the training step in CUDA graph 1") != std::string::npos);
  CHECK(log_graph.find("captured the training step in CUDA graph 2") == std::string::npos);  // one shape
  CHECK(log_graph.find("steps run eagerly") == std::string::npos);
  REQUIRE(graphed.size() == 50);
  REQUIRE(eager.size() == 50);
  for (std::size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    CHECK(graphed[i] == doctest::Approx(eager[i]).epsilon(2e-3));
  }
  const std::vector<double> again = cli_losses(dir, "graphed2", graphs, log_graph2);
  CHECK(again == graphed);
  // The same adapter, bit for bit (the final checkpoint's PEFT weights).
  const std::string adapter = ax::test::slurp(dir / "graphed" / "checkpoints" / "step-00000050" / "adapter_model.safetensors");
  CHECK(!adapter.empty());
  CHECK(ax::test::slurp(dir / "graphed2" / "checkpoints" / "step-00000050" / "adapter_model.safetensors") == adapter);
}

TEST_CASE("compile: GPU: without static_shapes each packed shape is its own graph, up to max_graphs") {
  if (no_cuda()) return;
  auto dir = ax::test::setup_run("compile_gpu_cap", "max_steps = 30\n");
  std::string log_eager, log_graph;
  const std::vector<double> eager = cli_losses(dir, "eager", {}, log_eager);
  const std::vector<double> graphed =
      cli_losses(dir, "graphed", {"compile.enabled=true", "compile.cuda_graphs=true", "compile.max_graphs=2",
                                  "compile.warmup_steps=1"}, log_graph);
  CHECK(log_graph.find("static_shapes = false") != std::string::npos);  // the packing warning
  REQUIRE(graphed.size() == eager.size());
  for (std::size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    CHECK(graphed[i] == doctest::Approx(eager[i]).epsilon(2e-3));
  }
}

// GPU: fp16 trains with dynamic loss scaling (core/src/train/loss_scaler.hpp), which lives in the step the graph
// captures: its scale and growth tracker are device tensors updated in place, so a replay scales, unscales, skips
// and backs off exactly as an eager step. The initial scale 2^16 overflows the first steps' fp16 gradients of
// this model at least sometimes; the graphed run must skip the same steps with the same scales as the eager one.
TEST_CASE("compile: GPU: fp16 with loss scaling: a graphed run skips and rescales as the eager run does") {
  if (no_cuda()) return;
  auto dir = ax::test::setup_run("compile_gpu_fp16", "max_steps = 40\n");
  std::string log_eager, log_graph;
  const std::vector<std::string> fp16{"model.dtype=\"fp16\""};
  std::vector<std::string> graphs{"compile.enabled=true", "compile.cuda_graphs=true", "compile.static_shapes=true",
                                  "compile.warmup_steps=1"};
  graphs.insert(graphs.end(), fp16.begin(), fp16.end());
  const std::vector<double> eager = cli_losses(dir, "eager", fp16, log_eager);
  const std::vector<double> graphed = cli_losses(dir, "graphed", graphs, log_graph);
  CHECK(log_graph.find("fp16: dynamic loss scaling") != std::string::npos);
  CHECK(log_graph.find("captured the training step in CUDA graph 1") != std::string::npos);
  CHECK(log_graph.find("steps run eagerly") == std::string::npos);
  const auto e = ax::test::step_records(dir / "eager" / "metrics.jsonl");
  const auto g = ax::test::step_records(dir / "graphed" / "metrics.jsonl");
  REQUIRE(e.size() == 40);
  REQUIRE(g.size() == 40);
  for (std::size_t i = 0; i < e.size(); ++i) {
    CAPTURE(i);
    CHECK(g[i]["loss_scale"] == e[i]["loss_scale"]);
    CHECK(g[i]["skipped"] == e[i]["skipped"]);
    CHECK(graphed[i] == doctest::Approx(eager[i]).epsilon(2e-3));
  }
}
