// The plugin loader against real plugins built by tests/plugins: one valid, and one of each way a
// plugin can be wrong. The refused ones abort the process if their code ever runs.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include "axengine/descriptor.hpp"
#include "axengine/optimizer.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/version.hpp"
#include "test_util.hpp"

using ax::PluginReport;
using namespace ax_test;

namespace {

const PluginReport& load(ax::PluginLoader& loader, const std::string& name) {
  return loader.load_file(test_plugin(name), "command line");
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string host_abi() { return std::to_string(ax::kPluginAbiMajor) + "." + std::to_string(ax::kPluginAbiMinor); }

}  // namespace

TEST_CASE("loader: a valid plugin loads and its provider works") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = load(loader, "test_ok");
  REQUIRE(r.status == PluginReport::Status::loaded);
  CHECK(r.name == "test_ok");
  CHECK(r.version == "1.2.3");
  CHECK(r.providers == std::vector<std::string>{"optimizer test_sgd"});
  auto provider = registry.get<ax::OptimizerProvider>(ax::ProviderKind::optimizer, "test_sgd");
  REQUIRE(provider);
  CHECK(registry.find(ax::ProviderKind::optimizer, "", "test_sgd")->info.plugin == "test_ok");

  at::Tensor p = at::ones({3}).requires_grad_();
  p.mutable_grad() = at::full({3}, 2.0);
  auto opt = provider->create({ax::ParamGroup{{p}, 0.0}}, toml::table{});
  opt->step(0.25);
  CHECK(at::allclose(p.detach(), at::full({3}, 0.5)));
}

TEST_CASE("loader: the descriptor is read without loading the library") {
  auto text = ax::read_descriptor_section(test_plugin("test_wrong_abi"));
  REQUIRE(text);
  auto d = ax::parse_descriptor(*text);
  CHECK(d.name == "test_wrong_abi");
  CHECK(d.abi_major == 99);
  CHECK(d.fingerprint.torch == ax::host_fingerprint().torch);
}

TEST_CASE("loader: wrong plugin ABI is refused naming both sides, its code never runs") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = load(loader, "test_wrong_abi");
  CHECK(r.status == PluginReport::Status::refused);
  CHECK(r.name == "test_wrong_abi");
  CHECK(contains(r.reason, "plugin ABI 99.0"));
  CHECK(contains(r.reason, "host: plugin ABI " + host_abi()));
  CHECK(registry.all().empty());
}

TEST_CASE("loader: a build fingerprint mismatch is refused naming both sides") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = load(loader, "test_bad_fingerprint");
  CHECK(r.status == PluginReport::Status::refused);
  CHECK(contains(r.reason, "torch 1.13.0"));
  CHECK(contains(r.reason, "host: torch " + ax::host_fingerprint().torch));
}

TEST_CASE("loader: a plugin whose registration throws keeps nothing") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = load(loader, "test_throws");
  CHECK(r.status == PluginReport::Status::refused);
  CHECK(contains(r.reason, "registration threw: registration failed on purpose"));
  CHECK(registry.find(ax::ProviderKind::optimizer, "", "test_throw_sgd") == nullptr);
  CHECK(load(loader, "test_ok").status == PluginReport::Status::loaded);  // and the next one still loads
}

TEST_CASE("loader: a shared object without a descriptor is skipped") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  const auto& r = load(loader, "test_not_a_plugin");
  CHECK(r.status == PluginReport::Status::skipped);
  CHECK(contains(r.reason, "not an axengine plugin"));
}

TEST_CASE("loader: garbage and truncated files are refused and never stop the others") {
  TempDir dir;
  std::string valid = read_file(test_plugin("test_ok"));
  REQUIRE(valid.size() > 4096);
  std::mt19937 rng(7);
  std::string garbage(10000, '\0');
  for (auto& c : garbage) c = static_cast<char>(rng());
  write_file(dir / "a_garbage.so", garbage);
  write_file(dir / "b_empty.so", "");
  write_file(dir / "c_elf_magic_only.so", std::string("\x7f" "ELF\x02\x01\x01", 7));
  write_file(dir / "d_header_only.so", valid.substr(0, 64));
  write_file(dir / "e_half.so", valid.substr(0, valid.size() / 2));
  write_file(dir / "f_last_byte_missing.so", valid.substr(0, valid.size() - 1));
  // Corrupt the section table offset to point far outside the file.
  std::string bad_offsets = valid;
  for (int i = 0; i < 8; ++i) bad_offsets[0x28 + i] = static_cast<char>(0x7f);
  write_file(dir / "g_bad_section_offset.so", bad_offsets);
  write_file(dir / "z_valid.so", valid);

  ax::Registry registry;
  ax::PluginLoader loader(registry);
  loader.discover({dir.path.string()}, "/nonexistent");
  const auto& reports = loader.reports();
  REQUIRE(reports.size() == 8);
  for (std::size_t i = 0; i + 1 < reports.size(); ++i) {
    INFO(reports[i].path << ": " << reports[i].reason);
    CHECK(reports[i].status == PluginReport::Status::refused);
    CHECK(contains(reports[i].reason, "unreadable"));
    CHECK(reports[i].origin == "config plugins.paths");
  }
  CHECK(reports.back().status == PluginReport::Status::loaded);
  CHECK(registry.find(ax::ProviderKind::optimizer, "", "test_sgd") != nullptr);
}

TEST_CASE("loader: a duplicate provider name is refused naming both origins") {
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  REQUIRE(load(loader, "test_ok").status == PluginReport::Status::loaded);
  const auto& r = load(loader, "test_dup");
  CHECK(r.status == PluginReport::Status::loaded);
  CHECK(r.providers == std::vector<std::string>{"optimizer test_sgd2"});
  CHECK(contains(r.reason, "optimizer test_sgd from " + test_plugin("test_dup")));
  CHECK(contains(r.reason, "already provided by " + test_plugin("test_ok")));
  CHECK(registry.find(ax::ProviderKind::optimizer, "", "test_sgd")->info.plugin == "test_ok");
}

TEST_CASE("loader: discovery order is config paths, AXENGINE_PLUGIN_PATH, executable dir") {
  TempDir cfg, env, exe;
  fs::copy_file(test_plugin("test_ok"), cfg / "axengine_test_ok.so");
  fs::copy_file(test_plugin("test_dup"), env / "axengine_test_dup.so");
  fs::create_directories(exe.path / "plugins");
  fs::copy_file(test_plugin("test_throws"), exe / "plugins/axengine_test_throws.so");
  fs::copy_file(test_plugin("test_ok"), exe / "plugins/axengine_test_ok.so");
  ::setenv("AXENGINE_PLUGIN_PATH", (env.path.string() + ":" + (cfg / "missing")).c_str(), 1);
  ax::Registry registry;
  ax::PluginLoader loader(registry);
  loader.discover({cfg.path.string()}, exe.path.string());
  ::unsetenv("AXENGINE_PLUGIN_PATH");

  const auto& r = loader.reports();
  REQUIRE(r.size() == 5);
  CHECK((r[0].name == "test_ok" && r[0].origin == "config plugins.paths" && r[0].status == PluginReport::Status::loaded));
  CHECK((r[1].name == "test_dup" && r[1].origin == "AXENGINE_PLUGIN_PATH"));
  CHECK((r[2].path == cfg / "missing" && r[2].status == PluginReport::Status::skipped));
  CHECK((r[3].name == "test_ok" && r[3].origin == "executable dir" && r[3].status == PluginReport::Status::refused));
  CHECK(contains(r[3].reason, "already loaded from " + (cfg / "axengine_test_ok.so")));
  CHECK((r[4].name == "test_throws" && r[4].origin == "executable dir" && r[4].status == PluginReport::Status::refused));
}

TEST_CASE("cli: plugins list reports loaded, refused and skipped plugins with reasons") {
  auto r = run("AXENGINE_PLUGIN_PATH=" + std::string(AXENGINE_TEST_PLUGIN_DIR) + " " + axengine() + " plugins list");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "[loaded] test_ok 1.2.3"));
  CHECK(contains(r.output, "[refused] test_wrong_abi"));
  CHECK(contains(r.output, "plugin ABI 99.0 (host: plugin ABI " + host_abi() + ")"));
  CHECK(contains(r.output, "[refused] test_bad_fingerprint"));
  CHECK(contains(r.output, "[skipped] -"));
  CHECK(contains(r.output, "optimizer test_sgd"));
}
