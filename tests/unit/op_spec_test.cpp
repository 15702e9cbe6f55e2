// Ops are registered data (axengine/op_spec.hpp): core's eight ops come from OpSpecs in the registry, a
// plugin defines a new op (tests/plugins/opspec: toy.scaled_add) with its own reference and conformance
// problems, and the generic conformance checks certify its correct backend and catch its planted bugs.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "axengine/builtins.hpp"
#include "axengine/conformance.hpp"
#include "axengine/descriptor.hpp"
#include "axengine/kernel_op.hpp"
#include "axengine/op_conformance.hpp"
#include "axengine/ops/norm_rope.hpp"
#include "axengine/plugin_loader.hpp"
#include "axengine/selection.hpp"
#include "test_util.hpp"

using ax::conformance::CaseResult;
using ax::conformance::Report;
using ax::conformance::Status;

namespace {

const std::string kToyOp = "toy.scaled_add";

std::string toy_plugin() { return std::string(AXENGINE_TEST_PLUGIN_DIR) + "/opspec/axengine_opspec_toy.so"; }

// The registry holds objects whose code lives in the plugin: it must go before the loader.
struct Session {
  std::unique_ptr<ax::Registry> registry = std::make_unique<ax::Registry>();
  ax::PluginLoader loader{*registry};
  ~Session() { registry.reset(); }
  Session() {
    ax::register_builtins(*registry);
    const auto& r = loader.load_file(toy_plugin(), "test");
    INFO(r.reason);
    REQUIRE(r.status == ax::PluginReport::Status::loaded);
  }
};

Report certify(const std::string& backend) {
  Session s;
  ax::conformance::Options o;
  o.op = kToyOp;
  o.backend = backend;
  o.device = "cpu";
  o.quick = true;
  return ax::conformance::run(*s.registry, o);
}

bool has(const CaseResult& c, const std::string& s) { return c.name.find(s) != std::string::npos; }
bool says(const CaseResult& c, const std::string& s) { return c.message.find(s) != std::string::npos; }

std::string failures(const Report& r) {
  std::ostringstream os;
  for (const auto& c : r.cases)
    if (c.status == Status::fail) os << "\n  " << c.name << ": " << c.message;
  return os.str();
}

bool any(const Report& r, Status status, const std::function<bool(const CaseResult&)>& pred) {
  return std::any_of(r.cases.begin(), r.cases.end(), [&](const CaseResult& c) { return c.status == status && pred(c); });
}

}  // namespace

TEST_CASE("op spec: core registers its eleven ops as OpSpecs with their reference backends") {
  ax::Registry registry;
  ax::register_builtins(registry);
  std::vector<std::string> ids;
  for (const ax::OpSpec* op : registry.ops()) ids.push_back(op->id);
  CHECK(ids == std::vector<std::string>{"moe.experts", "dequant", "norm_rope", "attention", "linear.lora", "rms_norm",
                                        "swiglu", "linear_ce", "moe.mlp", "linear_attention", "causal_conv1d"});
  const ax::OpSpec* moe = registry.op("moe");  // by config key
  REQUIRE(moe);
  CHECK(moe->id == "moe.experts");
  CHECK(moe->layouts == std::vector<std::string>{"EKN", "ENK"});
  CHECK(moe->tolerance("bf16").forward == doctest::Approx(2e-2));
  CHECK(registry.op("attention")->tolerance("fp32").backward == doctest::Approx(1e-4));  // attention's own column
  CHECK(registry.op("dequant")->tolerance("fp16").forward == doctest::Approx(5e-4));
  CHECK_THROWS_WITH_AS(moe->tolerance("fp64"), doctest::Contains("op moe.experts: no tolerance row for dtype 'fp64'"),
                       ax::UsageError);
  const ax::Provider* ref = registry.find(ax::ProviderKind::kernel, "dequant", "reference");
  REQUIRE(ref);
  CHECK(ref->info.needs.formats == std::vector<std::string>{"nf4", "mxfp4", "nvfp4", "fp8"});
  CHECK(ref->info.plugin == "builtin");
}

TEST_CASE("op spec: the registry refuses incomplete specs and kernels claiming outside their op's space") {
  ax::Registry registry;
  ax::register_builtins(registry);
  // A kernel claiming a layout norm_rope does not define.
  ax::Provider p;
  p.info.kind = ax::ProviderKind::kernel;
  p.info.op = "norm_rope";
  p.info.name = "wide";
  p.info.needs.layouts = {"EKN"};
  p.object = std::make_shared<int>(0);
  CHECK_THROWS_WITH_AS(registry.add(p), doctest::Contains("claims layout 'EKN', which op norm_rope does not define"),
                       ax::UsageError);
  // A kernel of an op nobody registered.
  p.info.op = "no.such_op";
  p.info.needs = {};
  CHECK_THROWS_WITH_AS(registry.add(p), doctest::Contains("unknown op 'no.such_op'"), ax::UsageError);

  auto add_op = [&](ax::OpSpec spec) {
    ax::Provider o;
    o.info.kind = ax::ProviderKind::op;
    o.info.name = spec.id;
    o.info.plugin = "someplugin";
    o.info.origin = "some.so";
    o.object = std::make_shared<ax::OpSpec>(std::move(spec));
    registry.add(std::move(o));
  };
  ax::OpSpec s;
  s.id = "t.op";
  s.config_key = "t_op";
  s.dtypes = {"fp32"};
  s.tolerances = {{"fp32", 1e-5, 1e-5}};
  s.reference = std::make_shared<int>(0);
  CHECK_THROWS_WITH_AS(add_op(s), doctest::Contains("op 't.op': has no conformance problem generator"), ax::UsageError);
  s.conformance = [](ax::conformance::Suite&) {};
  s.tolerances.clear();
  CHECK_THROWS_WITH_AS(add_op(s), doctest::Contains("no tolerance row for dtype 'fp32'"), ax::UsageError);
  s.tolerances = {{"fp32", 1e-5, 1e-5}};
  s.config_key = "moe";
  CHECK_THROWS_WITH_AS(add_op(s), doctest::Contains("clashes with op moe.experts"), ax::UsageError);
  s.config_key = "t_op";
  s.id = "norm_rope";
  CHECK_THROWS_WITH_AS(add_op(s), doctest::Contains("clashes with op norm_rope"), ax::UsageError);
  s.id = "t.op";
  add_op(s);
  CHECK(registry.op("t_op") == registry.op("t.op"));
  CHECK(registry.find(ax::ProviderKind::kernel, "t.op", "reference"));
}

TEST_CASE("op spec: a plugin defines a new op with its reference and its kernels are selected like core's") {
  Session s;
  ax::Registry& registry = *s.registry;
  const ax::OpSpec* op = registry.op("toy_scaled_add");
  REQUIRE(op);
  CHECK(op->id == kToyOp);
  CHECK(registry.ops().size() == ax::known_ops().size() + 1);  // core's ops and the toy
  const ax::Provider* ref = registry.find(ax::ProviderKind::kernel, kToyOp, "reference");
  REQUIRE(ref);
  CHECK(ref->info.plugin == "opspec_toy");
  CHECK(ref->info.needs.dtypes == std::vector<std::string>{"fp32", "bf16", "fp16"});
  CHECK(registry.find(ax::ProviderKind::op, "", kToyOp)->info.summary == "y = x + alpha z");
  const ax::Provider* good = registry.find(ax::ProviderKind::kernel, kToyOp, "toy_good");
  REQUIRE(good);
  CHECK(good->info.graph_safe);
  CHECK_FALSE(registry.find(ax::ProviderKind::kernel, kToyOp, "toy_bug_alpha")->info.graph_safe);
  // Selection over the plugin's op: the default list tries the plugin's backends in name order.
  ax::KernelPreferences prefs;
  ax::Resolution r = ax::resolve_backend(registry, prefs, kToyOp, ax::KernelQuery{ax::DeviceInfo{}, "bf16", "", ""});
  CHECK(r.chosen == "toy_good");  // the bug backends claim fp32 only
  r = ax::resolve_backend(registry, prefs, kToyOp, ax::KernelQuery{ax::DeviceInfo{}, "fp16", "", ""});
  CHECK(r.chosen == "reference");
}

TEST_CASE("op spec: the descriptor of an op-defining plugin is checked strictly") {
  auto parse = [](const std::string& providers) {
    return ax::parse_descriptor(R"({"axengine_plugin": 1, "abi": "2.0", "fingerprint": {"torch": "2.11.0", "cuda": "none",)"
                                R"( "compiler": "gcc 12", "cxx11_abi": "1"}, "plugin": {"name": "p", "version": "1",)"
                                R"( "providers": [)" + providers + "]}}");
  };
  auto d = parse(R"({"kind": "op", "name": "my.op"}, {"kind": "kernel", "op": "my.op", "name": "k", "graph_safe": true,)"
                 R"( "requires": {"layouts": ["L1"]}})");
  REQUIRE(d.providers.size() == 2);
  CHECK(d.providers[0].kind == ax::ProviderKind::op);
  CHECK(d.providers[1].op == "my.op");
  CHECK(d.providers[1].graph_safe);
  CHECK(d.providers[1].needs.layouts == std::vector<std::string>{"L1"});  // the registry checks them against the spec
  CHECK_THROWS_WITH_AS(parse(R"({"kind": "kernel", "op": "my.op", "name": "k"})"),
                       doctest::Contains("'plugin.providers[0].op' has 'my.op'"), ax::UsageError);
  CHECK_THROWS_WITH_AS(parse(R"({"kind": "op", "name": "my.op", "requires": {}})"),
                       doctest::Contains("'plugin.providers[0].requires' is for backends"), ax::UsageError);
  CHECK_THROWS_WITH_AS(parse(R"({"kind": "op", "name": "norm_rope"})"), doctest::Contains("one of core's ops"),
                       ax::UsageError);
  CHECK_THROWS_WITH_AS(parse(R"({"kind": "optimizer", "name": "o", "graph_safe": true})"),
                       doctest::Contains("'plugin.providers[0].graph_safe' is for kernel providers only"), ax::UsageError);
  CHECK_THROWS_WITH_AS(parse(R"({"kind": "kernel", "op": "moe", "name": "k", "graph_safe": 1})"),
                       doctest::Contains("'plugin.providers[0].graph_safe' must be true or false"), ax::UsageError);
}

TEST_CASE("op spec: conformance certifies a correct backend of a plugin-defined op") {
  Report r = certify("toy_good");
  INFO("failing cases:" << failures(r));
  CHECK(r.ok());
  CHECK(r.count(Status::pass) > 30);
  for (const char* c : {"toy.scaled_add/fwd/fp32/17x33", "toy.scaled_add/bwd/bf16/4x5x130", "/noncontig,out",
                        "toy.scaled_add/determinism/", "toy.scaled_add/repeat/", "toy.scaled_add/badinput/fp32/z_shape"}) {
    const std::string s = c;
    INFO(s);
    CHECK(any(r, Status::pass, [&](const CaseResult& x) { return has(x, s); }));
  }
  // Declared graph-safe: the CUDA-graph cases exist and skip on the CPU.
  CHECK(any(r, Status::skip, [](const CaseResult& x) {
    return has(x, "toy.scaled_add/cuda_graph/fwd/fp32/17x33") && says(x, "CUDA devices only");
  }));
  // The guard bands of the preallocated output are checked.
  CHECK(any(r, Status::pass, [](const CaseResult& x) { return says(x, "y guard bands intact"); }));
}

TEST_CASE("op spec: conformance catches a plugin op backend that ignores alpha") {
  Report r = certify("toy_bug_alpha");
  INFO("failing cases:" << failures(r));
  CHECK(any(r, Status::fail, [](const CaseResult& c) {
    return has(c, "toy.scaled_add/fwd/fp32/") && says(c, "y: norm-relative error");
  }));
  // Only forward is wrong: backward, determinism and bad input pass.
  CHECK_FALSE(any(r, Status::fail, [](const CaseResult& c) { return has(c, "/bwd/") || has(c, "/badinput/"); }));
  CHECK(any(r, Status::pass, [](const CaseResult& c) { return has(c, "/bwd/"); }));
}

TEST_CASE("op spec: conformance catches a plugin op backend that writes into its input") {
  Report r = certify("toy_bug_inplace");
  INFO("failing cases:" << failures(r));
  CHECK(any(r, Status::fail, [](const CaseResult& c) {
    return has(c, "toy.scaled_add/fwd/") && says(c, "the call modified its input 'x'");
  }));
  CHECK(any(r, Status::pass, [](const CaseResult& c) { return has(c, "/badinput/"); }));
}

TEST_CASE("op spec: generic checks over core's converted ops keep their case names") {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::conformance::Options o;
  o.op = "norm_rope";
  o.backend = "reference";
  o.device = "cpu";
  o.quick = true;
  Report r = ax::conformance::run(registry, o);
  INFO("failing cases:" << failures(r));
  CHECK(r.ok());
  for (const char* c : {"norm_rope/fwd/fp32/lead=17,H=3,D=64,R=64/cos_sin,w", "norm_rope/determinism/bf16/",
                        "norm_rope/badinput/fp16/inv_freq_wider_than_head", "position_ids,1+w,noncontig,out"}) {
    const std::string s = c;
    INFO(s);
    CHECK(any(r, Status::pass, [&](const CaseResult& x) { return has(x, s); }));
  }
  // The reference is not declared graph-safe: no CUDA-graph cases for it.
  CHECK_FALSE(std::any_of(r.cases.begin(), r.cases.end(), [](const CaseResult& c) { return has(c, "cuda_graph"); }));
}
