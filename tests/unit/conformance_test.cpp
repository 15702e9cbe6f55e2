// The conformance suite proves itself: a plugin that forwards to the reference passes every case, and
// each plugin with one planted bug (tests/plugins/conformance/) is caught by a failing case whose name
// says what is wrong. The quick grid keeps this CPU-fast; the plugins claim narrow requirements (as a
// real plugin would), which is also what keeps each run short.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <sstream>

#include "axengine/builtins.hpp"
#include "axengine/conformance.hpp"
#include "axengine/plugin_loader.hpp"

namespace {

using ax::conformance::CaseResult;
using ax::conformance::Report;
using ax::conformance::Status;

// The registry holds objects whose code lives in the plugins: it must go before the loader unloads them.
struct Session {
  std::unique_ptr<ax::Registry> registry = std::make_unique<ax::Registry>();
  ax::PluginLoader loader{*registry};
  ~Session() { registry.reset(); }
};

Report certify(const std::string& plugin, const std::string& op = "") {
  Session session;
  ax::Registry& registry = *session.registry;
  ax::register_builtins(registry);
  ax::PluginLoader& loader = session.loader;
  const std::string path = std::string(AXENGINE_TEST_PLUGIN_DIR) + "/conformance/axengine_" + plugin + ".so";
  const ax::PluginReport& r = loader.load_file(path, "test");
  INFO(path << ": " << r.reason);
  REQUIRE(r.status == ax::PluginReport::Status::loaded);
  ax::conformance::Options o;
  o.plugins = {r.name};
  o.op = op;
  o.device = "cpu";
  o.quick = true;
  return ax::conformance::run(registry, o);
}

std::vector<const CaseResult*> failures(const Report& r) {
  std::vector<const CaseResult*> out;
  for (const auto& c : r.cases)
    if (c.status == Status::fail) out.push_back(&c);
  return out;
}

std::string list(const std::vector<const CaseResult*>& cases) {
  std::ostringstream os;
  for (const auto* c : cases) os << "\n  " << c->name << ": " << c->message;
  return os.str();
}

// Caught: at least one failure matches `caught`, and every failure matches `all` (the bug shows where it
// is, and nowhere else).
void expect_caught(const Report& r, const std::function<bool(const CaseResult&)>& caught,
                   const std::function<bool(const CaseResult&)>& all) {
  auto f = failures(r);
  INFO("failing cases:" << list(f));
  CHECK(std::any_of(f.begin(), f.end(), [&](auto* c) { return caught(*c); }));
  CHECK(std::all_of(f.begin(), f.end(), [&](auto* c) { return all(*c); }));
  CHECK(r.count(Status::pass) > 0);  // the correct parts of the plugin still pass
}

bool has(const CaseResult& c, const std::string& s) { return c.name.find(s) != std::string::npos; }
bool says(const CaseResult& c, const std::string& s) { return c.message.find(s) != std::string::npos; }
// The LoRA flag in a moe.experts case name: ",lora" (",nolora" is the variant without).
bool with_lora(const CaseResult& c) { return has(c, ",lora"); }

}  // namespace

TEST_CASE("conformance: the reference backends pass their own suite on CPU") {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::conformance::Options o;
  o.backend = "reference";
  o.device = "cpu";
  o.quick = true;
  Report r = ax::conformance::run(registry, o);
  INFO("failing cases:" << list(failures(r)));
  CHECK(r.ok());
  CHECK(r.count(Status::pass) > 500);
}

TEST_CASE("conformance: a correct plugin passes every case") {
  Report r = certify("conf_correct");
  INFO("failing cases:" << list(failures(r)));
  CHECK(r.ok());
  for (const char* op : {"moe.experts", "dequant", "norm_rope", "attention", "linear.lora", "linear_attention", "causal_conv1d"}) {
    INFO(op);
    CHECK(std::count_if(r.cases.begin(), r.cases.end(),
                        [&](const CaseResult& c) { return c.op == op && c.status == Status::pass; }) > 20);
  }
  // Every edge case of the quick grid is there.
  for (const char* edge : {"E=1,k=1", "k=4,T=3", ",T=1,", "zero_tokens", "remote", "dropped", "noncontig", ",out",
                           "determinism", "repeat", "/expert_offsets_inconsistent", "selective_empty", "seqlens=1,",
                           "D=192,Dv=128", ",kseqlens="}) {
    const std::string e = edge;
    INFO(e);
    CHECK(std::any_of(r.cases.begin(), r.cases.end(), [&](const CaseResult& c) { return has(c, e); }));
  }
  std::ostringstream xml;
  ax::conformance::write_junit(r, xml);
  CHECK(xml.str().find("<testcase classname=\"moe.experts.conf_correct.cpu\"") != std::string::npos);
}

TEST_CASE("conformance: catches wrong LoRA scaling") {
  expect_caught(certify("conf_bug_lora_scaling"),
                [](auto& c) { return has(c, "moe.experts/fwd/") && with_lora(c) && says(c, "y: norm-relative error"); },
                [](auto& c) { return with_lora(c) || has(c, "determinism") || has(c, "repeat"); });
}

TEST_CASE("conformance: catches expert offsets off by one") {
  expect_caught(certify("conf_bug_offsets"), [](auto& c) { return has(c, "moe.experts/fwd/") && says(c, "y: norm"); },
                [](auto& c) { return !has(c, "badinput"); });
}

TEST_CASE("conformance: catches a dropped bias") {
  expect_caught(certify("conf_bug_bias_dropped"), [](auto& c) { return has(c, "moe.experts/fwd/") && has(c, ",bias"); },
                [](auto& c) { return has(c, "bias"); });
}

TEST_CASE("conformance: catches attention sinks silently ignored by a backend that claims every layout") {
  expect_caught(certify("conf_bug_sinks_ignored", "attention"),
                [](auto& c) { return has(c, "attention/fwd/") && has(c, ",sinks") && says(c, "out: norm-relative error"); },
                [](auto& c) { return has(c, "sinks"); });
}

TEST_CASE("conformance: catches a linear-attention state that does not reset at a sequence boundary") {
  // Only packed calls (seqlens=a+b+...) can show it; single sequences, determinism and bad input pass.
  expect_caught(certify("conf_bug_state_leak", "linear_attention"),
                [](auto& c) { return has(c, "linear_attention/fwd/") && has(c, "+") && says(c, "out: norm-relative error"); },
                [](auto& c) { return has(c, "seqlens=") && has(c, "+") && !has(c, "badinput"); });
}

TEST_CASE("conformance: catches dX without the LoRA term") {
  expect_caught(certify("conf_bug_dx_no_lora"),
                [](auto& c) { return has(c, "moe.experts/bwd/") && with_lora(c) && says(c, "dx: norm-relative error"); },
                [](auto& c) { return has(c, "/bwd/") || has(c, "determinism") || has(c, "repeat"); });
}

TEST_CASE("conformance: catches swapped nf4 nibbles") {
  expect_caught(certify("conf_bug_nf4_nibbles"), [](auto& c) { return has(c, "dequant/fwd/") && has(c, "/nf4"); },
                [](auto& c) { return has(c, "nf4"); });
}

TEST_CASE("conformance: catches nvfp4 scales decoded as E8M0") {
  expect_caught(certify("conf_bug_nvfp4_e8m0"), [](auto& c) { return has(c, "dequant/fwd/") && has(c, "/nvfp4"); },
                [](auto& c) { return has(c, "nvfp4"); });
}

TEST_CASE("conformance: catches nondeterministic dA/dB accumulation") {
  expect_caught(certify("conf_bug_nondeterministic"),
                [](auto& c) { return has(c, "moe.experts/determinism/") && says(c, "dlora_"); },
                [](auto& c) { return has(c, "determinism") || has(c, "repeat"); });
}

TEST_CASE("conformance: filters that match nothing are usage errors naming what is registered") {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::conformance::Options o;
  o.backend = "no_such_backend";
  CHECK_THROWS_WITH_AS(ax::conformance::run(registry, o), doctest::Contains("reference"), ax::UsageError);
  o.backend.clear();
  o.op = "moe.expert";
  CHECK_THROWS_WITH_AS(ax::conformance::run(registry, o), doctest::Contains("unknown op"), ax::UsageError);
}
