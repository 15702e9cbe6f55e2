// Plugins own config tables (PluginRegistrar::backend_options / config_table): Engine::start loads the plugins,
// then binds the whole config once, so a plugin's keys are held to the rules of core keys (types, locations,
// unknown keys with the closest one), a table no loaded plugin owns is an error naming it, and the bound
// options reach the backend. tests/plugins/loader/options_plugin.cpp is the plugin; scattermoe's own table
// is checked with the plugin (plugins/scattermoe/tests/scattermoe_options_test.cpp).
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include "axengine/engine.hpp"
#include "axengine/ops/dequant.hpp"
#include "axengine/ops/quant.hpp"
#include "axengine/plugin_loader.hpp"
#include "test_util.hpp"

using namespace ax_test;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// Two lines that load the test plugin through the config itself (phase 1 of the start reads them).
std::string load_test_plugin() { return "[plugins]\npaths = [\"" + test_plugin("test_options") + "\"]\n"; }

// `axengine validate` on `text` written to DIR/run.toml.
CommandResult validate(const TempDir& dir, const std::string& text, const std::string& extra = "") {
  write_file(dir / "run.toml", text);
  return run(axengine() + " validate --config " + (dir / "run.toml") + extra);
}

}  // namespace

TEST_CASE("plugin config: options in a plugin's tables reach its backend from the file and from --set") {
  TempDir dir;
  at::manual_seed(0);
  ax::ops::DequantArgs args;
  args.weight = ax::ops::quantize_nf4(at::randn({4, 128}), 64, false);
  args.dtype = at::kFloat;
  const at::Tensor ref = ax::ops::dequantize(args.weight, at::kFloat);
  auto output = [&](const std::string& text, const std::vector<std::string>& sets) {
    write_file(dir / "run.toml", text);
    ax::StartOptions o;
    o.config_file = dir / "run.toml";
    o.overrides = sets;
    o.plugin_files = {test_plugin("test_options")};
    o.discover = false;
    auto engine = ax::Engine::start(o);
    auto backend = engine->registry.kernel<ax::ops::Dequant>("test_options");
    REQUIRE(backend);
    return backend->dequantize(args);
  };
  CHECK(at::equal(output("", {}), ref));  // no tables: the plugin's defaults (scale 1, offset 0)
  CHECK(at::allclose(output("[kernels.options.test_options]\nscale = 3.0\n[test_options]\noffset = 0.5\n", {}), ref * 3 + 0.5));
  CHECK(at::allclose(output("[kernels.options.test_options]\nscale = 3.0\n",
                            {"kernels.options.test_options.scale=2", "test_options.offset=-1"}),
                     ref * 2 - 1));
}

TEST_CASE("plugin config: unknown keys and bad values in plugin tables exit 2 with file:line:column") {
  TempDir dir;
  auto r = validate(dir, load_test_plugin() + "[kernels.options.test_options]\nscael = 2.0\n");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:4:1: unknown key 'kernels.options.test_options.scael' "
                           "(did you mean 'kernels.options.test_options.scale'?)"));
  r = validate(dir, load_test_plugin() + "[test_options]\nofset = 1\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:4:1: unknown key 'test_options.ofset' (did you mean 'test_options.offset'?)"));
  r = validate(dir, load_test_plugin() + "[kernels.options.test_options]\nscale = \"big\"\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:4:9: 'kernels.options.test_options.scale' must be a number, not a string"));
  r = validate(dir, load_test_plugin() + "[kernels.options.test_options]\nscale = -1.0\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "'kernels.options.test_options.scale' must be > 0"));
  r = validate(dir, load_test_plugin(), " --set kernels.options.test_options.scael=2");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "unknown key 'kernels.options.test_options.scael' (did you mean 'kernels.options.test_options.scale'?)"));
  // Good tables bind: validate gets past binding to the run's own checks (this config has no model).
  r = validate(dir, load_test_plugin() + "[kernels.options.test_options]\nscale = 2.0\n[test_options]\noffset = 1.5\n");
  CHECK(contains(r.output, "[model] path is required"));
  CHECK_FALSE(contains(r.output, "unknown key"));
}

TEST_CASE("plugin config: a table for a backend that no loaded plugin provides is an error naming it") {
  TempDir dir;
  auto r = validate(dir, "[kernels.options.test_options]\nscale = 2.0\n");  // the plugin is not loaded
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:1:1: 'kernels.options.test_options': no loaded plugin provides backend 'test_options'"));
  r = validate(dir, load_test_plugin() + "[kernels.options.test_option]\nscale = 2.0\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:3:1: 'kernels.options.test_option': no loaded plugin provides backend 'test_option' "
                           "(did you mean 'kernels.options.test_options'?)"));
  r = validate(dir, "[test_options]\noffset = 1.0\n");  // a plugin's top-level table, the plugin absent
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:1:2: unknown key 'test_options'"));
  r = validate(dir, "[kernels.options]\ntest_options = 3\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "no loaded plugin provides backend 'test_options'"));
}

TEST_CASE("plugin config: the loader keeps only tables a plugin may own") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = loader.load_file(test_plugin("test_options_stray"), "command line");
  INFO(r.reason);
  REQUIRE(r.status == ax::PluginReport::Status::loaded);
  const std::vector<std::string> kept{"kernels.options.test_options_stray", "test_options_stray"};
  CHECK(r.config_tables == kept);
  CHECK(contains(r.reason, "config table [kernels.options.not_mine] is neither"));
  CHECK(contains(r.reason, "config table [someone_else] is neither"));
  REQUIRE(loader.config_tables().size() == 2);
  CHECK(loader.config_tables()[0].plugin == "test_options_stray");
}

TEST_CASE("plugin config: plugins list names the tables a plugin owns") {
  TempDir dir;
  write_file(dir / "run.toml", load_test_plugin());
  auto r = run(axengine() + " plugins list --config " + (dir / "run.toml"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "[loaded] test_options 1.0.0"));
  CHECK(contains(r.output, "config table [kernels.options.test_options]"));
  CHECK(contains(r.output, "config table [test_options]"));
}
