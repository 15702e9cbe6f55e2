// Kernel selection per GPU: preference lists, per-arch overrides, requirements, strict mode, and the
// arch override that lets all of this be tested without a GPU.
#include <doctest/doctest.h>

#include <regex>

#include <cstdlib>

#include "axengine/builtins.hpp"
#include "axengine/engine.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/selection.hpp"
#include "test_util.hpp"

namespace {

struct FakeBackend : ax::KernelBackend {};

void add(ax::Registry& reg, const std::string& op, const std::string& name, ax::Requirements req) {
  ax::ProviderInfo info;
  info.kind = ax::ProviderKind::kernel;
  info.op = op;
  info.name = name;
  info.needs = std::move(req);
  info.plugin = name + "_plugin";
  reg.add({info, std::make_shared<FakeBackend>()});
}

ax::Registry make_registry() {
  ax::Registry reg;
  add(reg, "moe.experts", "sonicmoe", {{"cuda"}, 90, 100, {"bf16", "fp16"}, {"dense"}, {}});
  add(reg, "moe.experts", "scattermoe", {{"cuda"}, 80, 0, {"bf16", "fp16"}, {"dense", "mxfp4", "nvfp4"}, {}});
  add(reg, "moe.experts", "reference", {});
  add(reg, "attention", "reference", {});
  return reg;
}

ax::DeviceInfo gpu(int arch) {
  ax::DeviceInfo d;
  d.type = ax::DeviceInfo::Type::cuda;
  d.arch = arch;
  return d;
}

ax::KernelPreferences prefs() {
  ax::KernelPreferences p;
  p.prefer["moe.experts"] = {"sonicmoe", "scattermoe", "reference"};
  p.by_arch[120]["moe.experts"] = {"scattermoe", "reference"};
  return p;
}

std::string verdict(const ax::Resolution& r, const std::string& backend) {
  for (const auto& c : r.candidates)
    if (c.backend == backend) return c.verdict;
  return "(absent)";
}

}  // namespace

TEST_CASE("selection: the first backend whose requirements fit the device wins") {
  auto reg = make_registry();
  auto r = ax::resolve_backend(reg, prefs(), "moe.experts", {gpu(90), "bf16", "dense", ""});
  CHECK(r.chosen == "sonicmoe");
  CHECK(r.list_source == "[kernels]");
  CHECK(verdict(r, "scattermoe") == "not tried (sonicmoe chosen first)");
}

TEST_CASE("selection: per-arch lists replace the default list on that arch") {
  auto reg = make_registry();
  auto r = ax::resolve_backend(reg, prefs(), "moe.experts", {gpu(120), "bf16", "dense", ""});
  CHECK(r.chosen == "scattermoe");
  CHECK(r.list_source == "[kernels.arch.sm_120]");
  CHECK(verdict(r, "sonicmoe") == "(absent)");
}

TEST_CASE("selection: requirements pass over backends with the reason") {
  auto reg = make_registry();
  auto p = prefs();
  p.by_arch.clear();
  auto r = ax::resolve_backend(reg, p, "moe.experts", {gpu(120), "bf16", "dense", ""});
  CHECK(r.chosen == "scattermoe");
  CHECK(verdict(r, "sonicmoe") == "needs sm_90..sm_100, device is sm_120");

  r = ax::resolve_backend(reg, p, "moe.experts", {ax::DeviceInfo{}, "fp32", "dense", ""});
  CHECK(r.chosen == "reference");
  CHECK(verdict(r, "sonicmoe") == "needs cuda, device is cpu");

  r = ax::resolve_backend(reg, p, "moe.experts", {gpu(90), "fp32", "dense", ""});
  CHECK(r.chosen == "reference");
  CHECK(verdict(r, "scattermoe") == "needs dtype bf16|fp16, asked for fp32");

  r = ax::resolve_backend(reg, p, "moe.experts", {gpu(90), "bf16", "nvfp4", ""});
  CHECK(r.chosen == "scattermoe");
  CHECK(verdict(r, "sonicmoe") == "needs weight format dense, asked for nvfp4");

  r = ax::resolve_backend(reg, p, "moe.experts", {gpu(75), "bf16", "dense", ""});
  CHECK(verdict(r, "scattermoe") == "needs sm_80 or newer, device is sm_75");
}

TEST_CASE("selection: reference is the implicit last resort unless strict") {
  auto reg = make_registry();
  ax::KernelPreferences p;
  p.prefer["moe.experts"] = {"sonicmoe"};
  auto r = ax::resolve_backend(reg, p, "moe.experts", {ax::DeviceInfo{}, "fp32", "", ""});
  CHECK(r.chosen == "reference");
  REQUIRE(r.candidates.size() == 2);

  p.strict = true;
  r = ax::resolve_backend(reg, p, "moe.experts", {ax::DeviceInfo{}, "fp32", "", ""});
  CHECK(r.chosen.empty());
  ax::KernelSet set(reg, p, ax::DeviceInfo{});
  CHECK_THROWS_WITH_AS(set.get_backend("moe.experts", "fp32", "", ""),
                       doctest::Contains("no backend for moe.experts"), ax::UsageError);
  CHECK_THROWS_WITH_AS(set.get_backend("moe.experts", "fp32", "", ""),
                       doctest::Contains("sonicmoe: needs cuda, device is cpu"), ax::UsageError);
}

TEST_CASE("selection: strict mode keeps reference for ops the config does not list") {
  auto reg = make_registry();
  ax::KernelPreferences p;
  p.strict = true;
  p.prefer["moe.experts"] = {"sonicmoe"};
  auto r = ax::resolve_backend(reg, p, "attention", {gpu(90), "bf16", "", ""});
  CHECK(r.chosen == "reference");
  CHECK(r.list_source == "default (all registered)");
  r = ax::resolve_backend(reg, p, "moe.experts", {gpu(90), "bf16", "", ""});
  CHECK(r.chosen == "sonicmoe");
}

TEST_CASE("selection: an op the config does not mention tries plugins by name, then reference") {
  auto reg = make_registry();
  auto r = ax::resolve_backend(reg, ax::KernelPreferences{}, "moe.experts", {gpu(100), "bf16", "", ""});
  CHECK(r.list_source == "default (all registered)");
  REQUIRE(r.candidates.size() == 3);
  CHECK(r.candidates[0].backend == "scattermoe");  // name order
  CHECK(r.chosen == "scattermoe");
  CHECK(r.candidates[2].backend == "reference");
}

TEST_CASE("selection: the default list puts plugin backends before core's builtin ones, reference last") {
  ax::Registry reg;
  add(reg, "linear.lora", "zeta", {{"cpu"}, 0, 0, {"bf16"}, {}, {}});  // a plugin's (zeta_plugin)
  ax::ProviderInfo info;  // a core backend like `aten`: plugin "builtin", sorted before zeta by name
  info.kind = ax::ProviderKind::kernel;
  info.op = "linear.lora";
  info.name = "aten";
  info.needs = {{"cpu"}, 0, 0, {"bf16", "fp16"}, {}, {}};
  reg.add({info, std::make_shared<FakeBackend>()});
  add(reg, "linear.lora", "reference", {});
  auto r = ax::resolve_backend(reg, ax::KernelPreferences{}, "linear.lora", {ax::DeviceInfo{}, "bf16", "", ""});
  REQUIRE(r.candidates.size() == 3);
  CHECK(r.candidates[0].backend == "zeta");
  CHECK(r.candidates[1].backend == "aten");
  CHECK(r.candidates[2].backend == "reference");
  CHECK(r.chosen == "zeta");
  r = ax::resolve_backend(reg, ax::KernelPreferences{}, "linear.lora", {ax::DeviceInfo{}, "fp16", "", ""});
  CHECK(r.chosen == "aten");
  CHECK(verdict(r, "zeta") == "needs dtype bf16, asked for fp16");
}

TEST_CASE("selection: linear_attention's written default order puts aten before the gdn plugin") {
  ax::Registry reg;
  add(reg, "linear_attention", "gdn", {{"cuda"}, 80, 0, {"fp32", "bf16", "fp16"}, {}, {}});
  ax::ProviderInfo info;
  info.kind = ax::ProviderKind::kernel;
  info.op = "linear_attention";
  info.name = "aten";
  info.plugin = "builtin";
  info.needs = {{"cpu", "cuda"}, 0, 0, {"fp32", "bf16", "fp16"}, {}, {}};
  reg.add({info, std::make_shared<FakeBackend>()});
  add(reg, "linear_attention", "reference", {});
  auto r = ax::resolve_backend(reg, ax::KernelPreferences{}, "linear_attention", {gpu(90), "bf16", "", ""});
  REQUIRE(r.candidates.size() == 3);
  CHECK(r.candidates[0].backend == "aten");
  CHECK(r.candidates[1].backend == "gdn");
  CHECK(r.chosen == "aten");
  ax::KernelPreferences gdn_first;  // what the config's list does
  gdn_first.prefer["linear_attention"] = {"gdn"};
  CHECK(ax::resolve_backend(reg, gdn_first, "linear_attention", {gpu(90), "bf16", "", ""}).chosen == "gdn");
}

TEST_CASE("selection: with the built-ins, linear.lora on a CPU bf16 query picks aten before reference") {
  ax::Registry reg;
  ax::register_builtins(reg);
  const ax::KernelPreferences none;
  auto r = ax::resolve_backend(reg, none, "linear.lora", {ax::DeviceInfo{}, "bf16", "dense", ""});
  CHECK(r.list_source == "default (all registered)");
  REQUIRE(r.candidates.size() == 2);
  CHECK(r.candidates[0].backend == "aten");
  CHECK(r.chosen == "aten");
  CHECK(verdict(r, "reference") == "not tried (aten chosen first)");
  CHECK(ax::resolve_backend(reg, none, "linear.lora", {ax::DeviceInfo{}, "fp16", "nf4", ""}).chosen == "aten");
  r = ax::resolve_backend(reg, none, "linear.lora", {ax::DeviceInfo{}, "fp32", "dense", ""});
  CHECK(r.chosen == "reference");  // fp32 (the HF parity runs) stays with the oracle
  CHECK(verdict(r, "aten") == "needs dtype bf16|fp16, asked for fp32");
  // attention/aten is flash: CUDA sm_80+ only
  CHECK(ax::resolve_backend(reg, none, "attention", {gpu(90), "bf16", "", ""}).chosen == "aten");
  r = ax::resolve_backend(reg, none, "attention", {ax::DeviceInfo{}, "bf16", "", ""});
  CHECK(r.chosen == "reference");
  CHECK(verdict(r, "aten") == "needs cuda, device is cpu");
  r = ax::resolve_backend(reg, none, "attention", {gpu(75), "fp16", "", ""});
  CHECK(verdict(r, "aten") == "needs sm_80 or newer, device is sm_75");
  CHECK(r.chosen == "reference");
}

TEST_CASE("selection: unregistered backends are reported, KernelSet caches per query") {
  auto reg = make_registry();
  ax::KernelPreferences p;
  p.prefer["attention"] = {"flash9000"};
  ax::KernelSet set(reg, p, gpu(90));
  auto a = set.get_backend("attention", "bf16", "", "");
  auto b = set.get_backend("attention", "bf16", "", "");
  CHECK(a == b);
  auto res = set.resolutions();
  REQUIRE(res.size() == 1);
  CHECK(verdict(res[0], "flash9000") == "not registered (no loaded plugin provides it)");
  CHECK(res[0].chosen == "reference");
}

TEST_CASE("device: AXENGINE_ARCH and device.arch make selection behave as on that GPU") {
  ::setenv("AXENGINE_ARCH", "sm_120", 1);
  auto d = ax::detect_device("auto", "sm_90");
  ::unsetenv("AXENGINE_ARCH");
  CHECK(d.is_cuda());
  CHECK(d.arch == 120);
  CHECK(d.arch_source == "AXENGINE_ARCH");
  d = ax::detect_device("auto", "sm_90a");
  CHECK(d.arch == 90);
  CHECK(d.arch_source == "config device.arch");
  CHECK_THROWS_AS(ax::detect_device("auto", "hopper"), ax::UsageError);
  CHECK_THROWS_AS(ax::detect_device("tpu", ""), ax::UsageError);
  CHECK(ax::parse_arch("sm_120") == 120);
  CHECK(!ax::parse_arch("sm_"));
}

TEST_CASE("cli: plugins explain prints the resolution with reasons, per arch") {
  using namespace ax_test;
  TempDir dir;
  write_file(dir / "run.toml",
             "[kernels]\nmoe_mlp = [\"sonicmoe\", \"reference\"]\nstrict = false\n"
             "[kernels.arch.sm_120]\nmoe_mlp = [\"scattermoe\", \"reference\"]\n");
  auto r = run("AXENGINE_ARCH=sm_120 " + axengine() + " plugins explain --config " + (dir / "run.toml"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("kernel backends for sm_120") != std::string::npos);
  CHECK(r.output.find("from [kernels.arch.sm_120]") != std::string::npos);
  // The moe.mlp lines (up to the next op's line) follow the sm_120 list: no sonicmoe there.
  const auto at = r.output.find("\n  moe.mlp ");
  REQUIRE(at != std::string::npos);
  auto end = at + 1;
  while ((end = r.output.find("\n  ", end + 1)) != std::string::npos && r.output[end + 3] == ' ') {}
  CHECK(r.output.substr(at, end == std::string::npos ? std::string::npos : end - at).find("sonicmoe") == std::string::npos);
  CHECK(r.output.find("\n  moe.experts ") == std::string::npos);  // no model calls it: not planned, not listed

  r = run(axengine() + " plugins explain --config " + (dir / "run.toml") +
          " --set device.type=cpu --set kernels.strict=true --set 'kernels.moe_mlp=[\"nosuchmoe\"]'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("nosuchmoe: not registered") != std::string::npos);
  // The op column is as wide as the longest op name listed: match the op and its backend with any padding.
  CHECK(std::regex_search(r.output, std::regex("\n  moe\\.mlp +\\(none\\)")));     // strict: no implicit fallback
  CHECK(std::regex_search(r.output, std::regex("\n  attention +reference")));  // unlisted ops keep theirs
}
