// The strict descriptor schema: unknown or misspelled keys at every level, wrong types and values outside
// their sets refuse the plugin with one line naming the key (and the closest known one); real plugins built
// with such descriptors are refused before any of their code runs; docs/plugins.md lists every key.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "axengine/descriptor.hpp"
#include "axengine/error.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/version.hpp"
#include "plugins/descriptor_schema.hpp"
#include "test_util.hpp"

using ax::PluginReport;
using namespace ax_test;

namespace {

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// The descriptor as AXENGINE_PLUGIN_DESCRIPTOR writes it around the author's JSON `plugin`.
nlohmann::json wrap(const nlohmann::json& plugin) {
  const auto& fp = ax::host_fingerprint();
  return {{"axengine_plugin", 1},
          {"abi", std::to_string(ax::kPluginAbiMajor) + "." + std::to_string(ax::kPluginAbiMinor)},
          {"fingerprint", {{"torch", fp.torch}, {"cuda", fp.cuda}, {"compiler", fp.compiler}, {"cxx11_abi", fp.cxx11_abi}}},
          {"plugin", plugin}};
}

nlohmann::json kernel_plugin(const nlohmann::json& provider_extra = nlohmann::json::object()) {
  nlohmann::json provider = {{"kind", "kernel"}, {"op", "moe.experts"}, {"name", "mymoe"}};
  provider.update(provider_extra);
  return {{"name", "myplugin"}, {"version", "1.0.0"}, {"providers", {provider}}};
}

// The refusal for a descriptor; "" when it parses.
std::string refusal(const nlohmann::json& descriptor) {
  try {
    ax::parse_descriptor(descriptor.dump());
  } catch (const ax::UsageError& e) {
    return e.what();
  }
  return "";
}

std::string refusal_of_requires(const nlohmann::json& req) { return refusal(wrap(kernel_plugin({{"requires", req}}))); }

}  // namespace

TEST_CASE("descriptor schema: a complete descriptor parses into every field") {
  auto d = ax::parse_descriptor(wrap({{"name", "myplugin"}, {"version", "1.0.0"}, {"summary", "test"},
                                      {"providers",
                                       {{{"kind", "kernel"}, {"op", "moe"}, {"name", "mymoe"}, {"summary", "s"},
                                         {"requires",
                                          {{"devices", {"cuda"}}, {"arch_min", "sm_80"}, {"arch_max", "sm_90a"},
                                           {"dtypes", {"bf16", "fp16"}}, {"formats", {"dense", "nvfp4"}},
                                           {"layouts", {"EKN", "ENK"}}}}},
                                        {{"kind", "optimizer"}, {"name", "my.sgd-2"}}}}})
                                    .dump());
  CHECK(d.name == "myplugin");
  REQUIRE(d.providers.size() == 2);
  const auto& k = d.providers[0];
  CHECK(k.op == "moe.experts");  // the config key resolves to the op id
  CHECK(k.summary == "s");
  CHECK(k.needs.devices == std::vector<std::string>{"cuda"});
  CHECK(k.needs.arch_min == 80);
  CHECK(k.needs.arch_max == 90);
  CHECK(k.needs.dtypes == std::vector<std::string>{"bf16", "fp16"});
  CHECK(k.needs.formats == std::vector<std::string>{"dense", "nvfp4"});
  CHECK(k.needs.layouts == std::vector<std::string>{"EKN", "ENK"});
  CHECK(d.providers[1].kind == ax::ProviderKind::optimizer);
  CHECK(d.providers[1].needs.devices.empty());  // absent: any
}

TEST_CASE("descriptor schema: unknown and misspelled keys at every level name the key and the closest one") {
  CHECK(refusal(wrap(kernel_plugin({{"require", {{"devices", {"cuda"}}}}}))) ==
        "plugin descriptor: unknown key 'plugin.providers[0].require' (did you mean 'requires'?)");
  CHECK(refusal_of_requires({{"device", {"cuda"}}}) ==
        "plugin descriptor: unknown key 'plugin.providers[0].requires.device' (did you mean 'devices'?)");
  CHECK(refusal_of_requires({{"archmin", "sm_80"}}) ==
        "plugin descriptor: unknown key 'plugin.providers[0].requires.archmin' (did you mean 'arch_min'?)");
  CHECK(refusal(wrap(kernel_plugin({{"priority", 3}}))) ==
        "plugin descriptor: unknown key 'plugin.providers[0].priority' (known keys: kind, op, name, summary, requires, graph_safe)");
  auto p = kernel_plugin();
  p["verison"] = "1";
  CHECK(refusal(wrap(p)) == "plugin descriptor: unknown key 'plugin.verison' (did you mean 'version'?)");
  auto d = wrap(kernel_plugin());
  d["fingerprint"]["cuda_version"] = "12";
  CHECK(contains(refusal(d), "unknown key 'fingerprint.cuda_version'"));
  d = wrap(kernel_plugin());
  d["extra"] = true;
  CHECK(contains(refusal(d), "unknown key 'extra'"));
}

TEST_CASE("descriptor schema: types, required keys and the outer fields") {
  CHECK(refusal_of_requires({{"devices", "cuda"}}) ==
        "plugin descriptor: 'plugin.providers[0].requires.devices' must be a list of strings");
  CHECK(refusal_of_requires({{"arch_min", 80}}) == "plugin descriptor: 'plugin.providers[0].requires.arch_min' must be a string");
  CHECK(refusal(wrap(kernel_plugin({{"requires", {"cuda"}}}))) ==
        "plugin descriptor: 'plugin.providers[0].requires' must be an object");
  CHECK(refusal(wrap(kernel_plugin({{"summary", 5}}))) == "plugin descriptor: 'plugin.providers[0].summary' must be a string");
  auto p = kernel_plugin();
  p["providers"] = {1};
  CHECK(refusal(wrap(p)) == "plugin descriptor: 'plugin.providers' must be a list of objects");
  p = kernel_plugin();
  p.erase("version");
  CHECK(refusal(wrap(p)) == "plugin descriptor: missing 'plugin.version'");
  p = kernel_plugin();
  p["providers"][0].erase("op");
  CHECK(contains(refusal(wrap(p)), "missing 'plugin.providers[0].op'"));
  p = {{"name", "x"}, {"version", "1"}, {"providers", {{{"kind", "optimizer"}, {"name", "o"}, {"op", "dequant"}}}}};
  CHECK(contains(refusal(wrap(p)), "'plugin.providers[0].op' is for kernel providers only"));

  auto d = wrap(kernel_plugin());
  d["axengine_plugin"] = 2;
  CHECK(refusal(d) == "plugin descriptor: 'axengine_plugin' is 2, expected 1");
  for (const char* abi : {"1", "1.", ".0", "1.0.0", "1.x", "-1.0", " 1.0"}) {
    d = wrap(kernel_plugin());
    d["abi"] = abi;
    CHECK_MESSAGE(contains(refusal(d), "expected MAJOR.MINOR"), abi);
  }
  CHECK(refusal(nlohmann::json::array()) == "plugin descriptor: not a JSON object");
  CHECK_THROWS_WITH_AS(ax::parse_descriptor("{\"abi\": "), "plugin descriptor: not valid JSON", ax::UsageError);
}

TEST_CASE("descriptor schema: values outside their sets are refused with the closest valid one") {
  CHECK(refusal_of_requires({{"dtypes", {"bf61"}}}) ==
        "plugin descriptor: 'plugin.providers[0].requires.dtypes' has 'bf61', expected one of fp32, bf16, fp16 (did you "
        "mean 'bf16'?)");
  CHECK(contains(refusal_of_requires({{"devices", {"gpu"}}}), "'plugin.providers[0].requires.devices' has 'gpu', expected one of cpu, cuda"));
  CHECK(contains(refusal_of_requires({{"formats", {"nf5"}}}), "has 'nf5', expected one of dense, nf4, mxfp4, nvfp4, fp8 (did you mean 'nf4'?)"));
  CHECK(contains(refusal_of_requires({{"layouts", {"EKM"}}}), "has 'EKM', expected one of EKN, ENK (did you mean 'EKN'?)"));
  CHECK(contains(refusal_of_requires({{"arch_min", "90"}}), "'plugin.providers[0].requires.arch_min' is '90', expected an arch like \"sm_90\""));
  CHECK(contains(refusal_of_requires({{"arch_max", "sm_9"}}), "arch_max' is 'sm_9'"));
  CHECK(contains(refusal_of_requires({{"arch_min", "sm_100"}, {"arch_max", "sm_90"}}), "'plugin.providers[0].requires.arch_min' (sm_100) is above"));
  CHECK(contains(refusal(wrap(kernel_plugin({{"kind", "kernal"}}))), "'plugin.providers[0].kind' has 'kernal', expected one of kernel, model, dataset, optimizer, op, quantizer, executor (did you mean 'kernel'?)"));
  CHECK(contains(refusal(wrap(kernel_plugin({{"op", "moe.expert"}}))), "'plugin.providers[0].op' has 'moe.expert'"));
  CHECK(contains(refusal(wrap(kernel_plugin({{"name", "my moe"}}))), "'plugin.providers[0].name' is 'my moe'"));
  // Layouts exist per op: dequant has none.
  auto p = kernel_plugin({{"op", "dequant"}, {"requires", {{"layouts", {"EKN"}}}}});
  CHECK(contains(refusal(wrap(p)), "'plugin.providers[0].requires.layouts' has 'EKN', expected none"));
}

TEST_CASE("descriptor schema: plugins built with a misspelled requires, an unknown key or a bad dtype are refused") {
  // Each aborts the process if its code runs: a refusal is the only way through.
  const std::vector<std::pair<std::string, std::string>> cases{
      {"test_schema_require_typo", "unknown key 'plugin.providers[0].require' (did you mean 'requires'?)"},
      {"test_schema_unknown_key", "unknown key 'plugin.providers[0].priority'"},
      {"test_schema_bad_dtype", "'plugin.providers[0].requires.dtypes' has 'bf61'"},
  };
  for (const auto& [plugin, why] : cases) {
    ax::Registry registry;
    ax::PluginLoader loader(registry);
    const auto& r = loader.load_file(test_plugin(plugin), "command line");
    INFO(plugin << ": " << r.reason);
    CHECK(r.status == PluginReport::Status::refused);
    CHECK(contains(r.reason, why));
    CHECK(r.reason.find('\n') == std::string::npos);  // one line
    CHECK(registry.all().empty());
  }
}

TEST_CASE("descriptor schema: docs/plugins.md documents every key of the schema") {
  const std::string docs = read_file(std::string(AXENGINE_SOURCE_DIR) + "/docs/plugins.md");
  REQUIRE(!docs.empty());
  for (const auto& object : ax::descriptor_schema::objects())
    for (const auto& key : object.keys) {
      // Author keys are documented relative to "plugin" (as written in AXENGINE_PLUGIN_DESCRIPTOR).
      std::string path = std::string(object.path);
      if (path.rfind("plugin", 0) == 0) path = path.substr(path.size() > 6 ? 7 : 6);
      const std::string cell = "| `" + (path.empty() ? "" : path + ".") + std::string(key.name) + "` |";
      CHECK_MESSAGE(contains(docs, cell), "docs/plugins.md lacks the row " << cell);
    }
}
