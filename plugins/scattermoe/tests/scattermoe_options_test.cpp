// scattermoe's config table [kernels.options.scattermoe] is held to the rules of core keys (the engine binds it
// with the rest of the config, tests/unit/plugin_config_test.cpp): unknown keys with the closest one, values
// outside their set, types, and `plugins list` naming the table. Needs the built plugin; without nvcc there is
// none and the case says so.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "test_util.hpp"

using namespace ax_test;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// `axengine validate` on `text` written to DIR/run.toml.
CommandResult validate(const TempDir& dir, const std::string& text) {
  write_file(dir / "run.toml", text);
  return run(axengine() + " validate --config " + (dir / "run.toml"));
}

}  // namespace

TEST_CASE("plugin config: scattermoe options are checked like core keys") {
  const std::string so = std::string(AXENGINE_PLUGIN_DIR) + "/axengine_scattermoe.so";
  if (!fs::exists(so)) {
    MESSAGE("scattermoe was not built (no nvcc): its table is not checked here");
    return;
  }
  TempDir dir;
  auto r = validate(dir, "[kernels.options.scattermoe]\npth = \"split\"\n");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:2:1: unknown key 'kernels.options.scattermoe.pth' (did you mean 'kernels.options.scattermoe.path'?)"));
  r = validate(dir, "[kernels.options.scattermoe]\npath = \"splt\"\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:2:8: 'kernels.options.scattermoe.path' is \"splt\", expected one of auto, fused, split, "
                           "split_gmm (did you mean \"split\"?)"));
  r = validate(dir, "[kernels.options.scattermoe]\ntile = \"64x12\"\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "run.toml:2:8: 'kernels.options.scattermoe.tile': unknown tile configuration '64x12'"));
  CHECK(contains(r.output, "did you mean '64x128'?"));
  r = validate(dir, "[kernels.options.scattermoe]\ntile = \"64x128,128x64\"\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "force the same kind of GEMM"));
  r = validate(dir, "[kernels.options.scattermoe]\ntune = \"yes\"\n");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "'kernels.options.scattermoe.tune' must be true or false, not a string"));
  r = validate(dir, "[kernels.options.scattermoe]\npath = \"split_gmm\"\ntile = \"64x128,gram128x32\"\ntune = true\n"
                    "tuning_cache = \"tuning.json\"\n");
  CHECK(contains(r.output, "[model] path is required"));  // bound; the run's own checks come next
  CHECK_FALSE(contains(r.output, "kernels.options."));
  r = run(axengine() + " plugins list");
  CHECK(contains(r.output, "config table [kernels.options.scattermoe]"));
}
