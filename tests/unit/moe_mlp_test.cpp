// moe.mlp: the reference passes its conformance problems on CPU (incl. the fp64 oracle cases), a backend with
// a planted bug is caught, the default preference list skips what is missing or cannot run on the arch
// (AXENGINE_ARCH), and the run-time decline hands a call to the next backend, logged once.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <unistd.h>

#include "axengine/builtins.hpp"
#include "axengine/conformance.hpp"
#include "axengine/device.hpp"
#include "axengine/op_conformance.hpp"
#include "axengine/ops/moe_mlp.hpp"
#include "axengine/plugin.hpp"
#include "axengine/selection.hpp"
#include "axengine/strings.hpp"
#include "test_util.hpp"

namespace {

using ax::conformance::Report;
using ax::conformance::Status;
using ax::ops::MoeMlp;
using ax::ops::MoeMlpArgs;

std::string failing(const Report& r) {
  std::ostringstream os;
  for (const auto& c : r.cases)
    if (c.status == Status::fail) os << "\n  " << c.name << ": " << c.message;
  return os.str();
}

// Registers `backend` for moe.mlp under `name` (plugin "test"), claiming everything on every device.
void add_mlp(ax::Registry& reg, const std::string& name, std::shared_ptr<MoeMlp> backend, ax::Requirements needs = {}) {
  ax::Provider p;
  p.info.kind = ax::ProviderKind::kernel;
  p.info.op = MoeMlp::kOp;
  p.info.name = name;
  p.info.plugin = "test";
  p.info.needs = std::move(needs);
  p.object = std::move(backend);
  reg.add(std::move(p));
}

std::shared_ptr<MoeMlp> reference_of(const ax::Registry& reg) {
  return std::static_pointer_cast<MoeMlp>(reg.find(ax::ProviderKind::kernel, MoeMlp::kOp, "reference")->object);
}

// Forwards to the reference, but with the down projection's bias dropped: what conformance must catch.
class DropsDownBias final : public MoeMlp {
 public:
  explicit DropsDownBias(std::shared_ptr<MoeMlp> ref) : ref_(std::move(ref)) {}

 protected:
  ax::ops::MoeMlpResult run_forward(const MoeMlpArgs& a) override {
    MoeMlpArgs b = a;
    b.down_bias = at::Tensor();
    return ref_->forward(b);
  }
  ax::ops::MoeMlpGrads run_backward(const MoeMlpArgs& a, const ax::ops::MoeMlpBackwardArgs& bwd) override {
    return ref_->backward(a, bwd);
  }

 private:
  std::shared_ptr<MoeMlp> ref_;
};

// Reads the gate_up LoRA's B rows as halves (gate rows first, then up) whatever the packing: on interleaved
// weights (gpt-oss) its LoRA delta lands on the wrong gate/up columns. Forward and backward both.
class LoraBOnHalves final : public MoeMlp {
 public:
  explicit LoraBOnHalves(std::shared_ptr<MoeMlp> ref) : ref_(std::move(ref)) {}

 protected:
  ax::ops::MoeMlpResult run_forward(const MoeMlpArgs& a) override { return ref_->forward(bug(a)); }
  ax::ops::MoeMlpGrads run_backward(const MoeMlpArgs& a, const ax::ops::MoeMlpBackwardArgs& bwd) override {
    return ref_->backward(bug(a), bwd);
  }

 private:
  static MoeMlpArgs bug(MoeMlpArgs a) {
    if (a.packing != ax::ops::GluPacking::interleaved || !a.gate_up_lora.defined()) return a;
    const int64_t I = a.gate_up_lora.b.size(0) / 2;
    at::Tensor rows = at::stack({at::arange(I), at::arange(I) + I}, 1).reshape({-1});  // column 2i ← i, 2i+1 ← I+i
    a.gate_up_lora.b = a.gate_up_lora.b.index_select(0, rows.to(a.gate_up_lora.b.device()));
    return a;
  }
  std::shared_ptr<MoeMlp> ref_;
};

// Declines calls wider than `max_h` (a stand-in for "outside my tiles"); counts the calls it serves.
class Narrow final : public MoeMlp {
 public:
  Narrow(std::shared_ptr<MoeMlp> ref, int64_t max_h) : ref_(std::move(ref)), max_h_(max_h) {}
  std::optional<std::string> decline(const MoeMlpArgs& a) const override {
    if (a.x.size(1) > max_h_) return ax::str("H = ", a.x.size(1), " is outside its tiles (H <= ", max_h_, ")");
    return std::nullopt;
  }
  int served = 0;

 protected:
  ax::ops::MoeMlpResult run_forward(const MoeMlpArgs& a) override {
    ++served;
    return ref_->forward(a);
  }
  ax::ops::MoeMlpGrads run_backward(const MoeMlpArgs& a, const ax::ops::MoeMlpBackwardArgs& b) override {
    ++served;
    return ref_->backward(a, b);
  }

 private:
  std::shared_ptr<MoeMlp> ref_;
  int64_t max_h_;
};

// A small valid block: T tokens of width H, E experts, top-2, silu_glu, LoRA on both projections.
MoeMlpArgs small_block(int64_t H, unsigned seed) {
  const int64_t T = 6, E = 4, I = 8, k = 2, r = 2;
  at::Generator g = ax::conformance::case_generator(seed, "moe_mlp_test");
  MoeMlpArgs a;
  a.x = at::randn({T, H}, g, at::kFloat);
  at::Tensor top = at::stack({at::arange(T) % E, (at::arange(T) + 1) % E}, 1).reshape({-1});
  auto [sorted, perm] = top.sort(true, 0, false);
  a.routing.sorted_expert_idxs = sorted;
  a.routing.sorted_scattered_idxs = perm;
  a.routing.expert_offsets = at::bincount(top, {}, E).cumsum(0);
  a.routing.top_k = k;
  a.gates = at::rand({T, k}, g, at::kFloat);
  a.gate_up = ax::ops::WeightTensor::dense(at::randn({E, H, 2 * I}, g, at::kFloat));
  a.down = ax::ops::WeightTensor::dense(at::randn({E, I, H}, g, at::kFloat));
  a.gate_up_lora = {at::randn({r * E, H}, g, at::kFloat), at::randn({2 * I, r * E}, g, at::kFloat), 0.5};
  a.down_lora = {at::randn({r * E, I}, g, at::kFloat), at::randn({H, r * E}, g, at::kFloat), 0.5};
  return a;
}

// stderr of `body` (the log sink writes there).
std::string capture_stderr(const std::function<void()>& body) {
  ax_test::TempDir dir;
  const std::string path = (dir / "stderr.txt");
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* f = std::fopen(path.c_str(), "w");
  ::dup2(::fileno(f), 2);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(f);
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string verdict(const ax::Resolution& r, const std::string& backend) {
  for (const auto& c : r.candidates)
    if (c.backend == backend) return c.verdict;
  return "(absent)";
}

}  // namespace

TEST_CASE("moe.mlp: the reference passes its conformance problems on CPU, fp64 oracle included") {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::conformance::Options o;
  o.op = "moe.mlp";
  o.backend = "reference";
  o.device = "cpu";
  o.quick = true;
  Report r = ax::conformance::run(registry, o);
  INFO("failing cases:" << failing(r));
  CHECK(r.ok());
  CHECK(r.count(Status::pass) > 60);
  auto any = [&](const std::string& name, const std::string& msg) {
    for (const auto& c : r.cases)
      if (c.status == Status::pass && c.name.find(name) != std::string::npos && c.message.find(msg) != std::string::npos)
        return true;
    return false;
  };
  // The oracle ran on both activations, quantised weights and the routing edge cases.
  CHECK(any("fp32/dense/EKN/", "fp64 oracle"));
  CHECK(any("clamped_glu,interleaved", "fp64 oracle"));
  CHECK(any("fp32/nf4/", "fp64 oracle"));
  CHECK(any("fp32/mxfp4/", "fp64 oracle"));
  CHECK(any("dropped", "fp64 oracle"));
  CHECK(any("remote", "dead-token rows exactly zero"));
  CHECK(any("badinput", ""));
  CHECK(any("determinism", ""));
}

TEST_CASE("moe.mlp: conformance catches a backend that drops the down bias") {
  ax::Registry registry;
  ax::register_builtins(registry);
  add_mlp(registry, "drops_bias", std::make_shared<DropsDownBias>(reference_of(registry)),
          {{"cpu"}, 0, 0, {"fp32"}, {"dense"}, {"EKN"}});
  ax::conformance::Options o;
  o.op = "moe.mlp";
  o.backend = "drops_bias";
  o.device = "cpu";
  o.quick = true;
  Report r = ax::conformance::run(registry, o);
  int caught = 0;
  for (const auto& c : r.cases) {
    if (c.status != Status::fail) continue;
    INFO(c.name << ": " << c.message);
    CHECK(c.name.find(",bias") != std::string::npos);  // fails only where there is a bias
    ++caught;
  }
  CHECK(caught > 0);
  CHECK(r.count(Status::pass) > 0);
}

TEST_CASE("moe.mlp: conformance catches a backend that applies the gate_up LoRA in halves order on interleaved (gpt-oss) weights") {
  ax::Registry registry;
  ax::register_builtins(registry);
  add_mlp(registry, "lora_on_halves", std::make_shared<LoraBOnHalves>(reference_of(registry)),
          {{"cpu"}, 0, 0, {"fp32"}, {"dense", "mxfp4"}, {"EKN", "ENK"}});
  ax::conformance::Options o;
  o.op = "moe.mlp";
  o.backend = "lora_on_halves";
  o.device = "cpu";
  o.quick = true;
  Report r = ax::conformance::run(registry, o);
  int caught = 0, gpt_oss = 0;
  for (const auto& c : r.cases) {
    if (c.status != Status::fail) continue;
    INFO(c.name << ": " << c.message);
    CHECK(c.name.find("interleaved") != std::string::npos);  // the halves problems are right
    CHECK(c.name.find("lora_down") == std::string::npos);    // and so are those without a gate_up LoRA
    gpt_oss += c.name.find("clamped_glu,interleaved,lora,bias") != std::string::npos;
    ++caught;
  }
  CHECK(gpt_oss > 0);  // the gpt-oss layout's own problems catch it, dense and mxfp4
  CHECK(caught > 0);
  CHECK(r.count(Status::pass) > 0);
}

TEST_CASE("moe.mlp: the default list skips a backend that is missing or cannot run on the arch") {
  ax::Registry reg;
  ax::register_builtins(reg);
  ax::KernelPreferences none;
  ax::DeviceInfo cpu;
  auto r = ax::resolve_backend(reg, none, "moe.mlp", {cpu, "bf16", "dense", "ENK"});
  CHECK(r.list_source == "default for moe.mlp");
  CHECK(verdict(r, "sonicmoe") == "not registered (no loaded plugin provides it)");
  CHECK(verdict(r, "scattermoe") == "not registered (no loaded plugin provides it)");
  CHECK(r.chosen == "reference");

  // Stand-ins with the real plugins' requirements.
  add_mlp(reg, "sonicmoe", std::make_shared<Narrow>(reference_of(reg), 1 << 20),
          {{"cuda"}, 90, 100, {"bf16", "fp16"}, {"dense"}, {}});
  add_mlp(reg, "scattermoe", std::make_shared<Narrow>(reference_of(reg), 1 << 20),
          {{"cuda"}, 80, 0, {"bf16", "fp16"}, {"dense", "nf4", "mxfp4", "nvfp4"}, {}});
  for (const char* arch : {"sm_120", "sm_80", "sm_90"}) {
    ::setenv("AXENGINE_ARCH", arch, 1);
    ax::DeviceInfo dev = ax::detect_device("auto", "");
    ::unsetenv("AXENGINE_ARCH");
    CAPTURE(arch);
    r = ax::resolve_backend(reg, none, "moe.mlp", {dev, "bf16", "dense", "ENK"});
    // The default list puts sonicmoe first (faster on the H200, measured): it serves on sm_90 only; elsewhere
    // scattermoe, with the reason.
    if (dev.arch == 90) {
      CHECK(r.chosen == "sonicmoe");
      CHECK(verdict(r, "scattermoe") == "not tried (sonicmoe chosen first)");
      CHECK(r.fallbacks == std::vector<std::string>{"scattermoe", "reference"});
    } else {
      CHECK(r.chosen == "scattermoe");
      CHECK(verdict(r, "sonicmoe") == ax::str("needs sm_90..sm_100, device is ", arch));
      CHECK(r.fallbacks == std::vector<std::string>{"reference"});
    }
  }
  // A config that puts scattermoe first gets it everywhere, sonicmoe behind it on sm_90.
  ax::KernelPreferences scatter_first;
  scatter_first.prefer["moe.mlp"] = {"scattermoe", "sonicmoe", "reference"};
  for (const char* arch : {"sm_120", "sm_80", "sm_90"}) {
    ::setenv("AXENGINE_ARCH", arch, 1);
    ax::DeviceInfo dev = ax::detect_device("auto", "");
    ::unsetenv("AXENGINE_ARCH");
    CAPTURE(arch);
    r = ax::resolve_backend(reg, scatter_first, "moe.mlp", {dev, "bf16", "dense", "ENK"});
    CHECK(r.chosen == "scattermoe");
    CHECK(verdict(r, "sonicmoe") == "not tried (scattermoe chosen first)");
    CHECK(r.fallbacks == (dev.arch == 90 ? std::vector<std::string>{"sonicmoe", "reference"} : std::vector<std::string>{"reference"}));
  }
  // A config list still wins over the default.
  ax::KernelPreferences p;
  p.prefer["moe.mlp"] = {"reference"};
  r = ax::resolve_backend(reg, p, "moe.mlp", {cpu, "bf16", "dense", "ENK"});
  CHECK(r.list_source == "[kernels]");
  CHECK(r.chosen == "reference");
}

TEST_CASE("moe.mlp: a backend that declines a call hands it to the next one, logged once") {
  ax::Registry reg;
  ax::register_builtins(reg);
  auto narrow = std::make_shared<Narrow>(reference_of(reg), 16);
  add_mlp(reg, "narrow", narrow);
  ax::KernelPreferences p;
  p.prefer["moe.mlp"] = {"narrow", "reference"};
  ax::KernelSet ks(reg, p, ax::DeviceInfo{});
  auto chain_list = ks.get_all<MoeMlp>("fp32", "dense", "EKN");
  REQUIRE(chain_list.size() == 2);
  CHECK(chain_list[0].first == "narrow");
  CHECK(chain_list[1].first == "reference");
  std::vector<ax::ops::NamedMoeMlp> named;
  for (auto& [n, b] : chain_list) named.push_back({n, b});
  auto chain = ax::ops::moe_mlp_chain(named);
  auto ref = reference_of(reg);

  // H = 16: narrow serves forward and backward.
  MoeMlpArgs small = small_block(16, 1);
  auto y = chain->forward(small);
  ax::ops::MoeMlpBackwardArgs b;
  b.grad_y = at::ones_like(y.y);
  b.saved = y.saved;
  chain->backward(small, b);
  CHECK(narrow->served == 2);
  CHECK(!chain->decline(small));

  // H = 24: narrow declines, the reference serves (same numbers as calling it directly); logged once.
  MoeMlpArgs wide = small_block(24, 2);
  at::Tensor got;
  const std::string err = capture_stderr([&] {
    for (int i = 0; i < 3; ++i) {
      auto r = chain->forward(wide);
      got = r.y;
      ax::ops::MoeMlpBackwardArgs bw;
      bw.grad_y = at::ones_like(r.y);
      bw.saved = r.saved;
      chain->backward(wide, bw);
    }
  });
  CHECK(narrow->served == 2);
  CHECK(at::equal(got, ref->forward(wide).y));
  const std::string line = "narrow declined a call (H = 24 is outside its tiles (H <= 16)); reference serves it";
  INFO(err);
  auto first = err.find(line);
  CHECK(first != std::string::npos);
  CHECK(err.find(line, first + 1) == std::string::npos);

  // Everything declines: an error naming each reason.
  auto only = ax::ops::moe_mlp_chain({{"narrow", narrow}});
  CHECK_THROWS_WITH_AS(only->forward(wide), doctest::Contains("every backend declined this call: narrow declined"),
                       ax::UsageError);
}

TEST_CASE("cli: plugins explain lists moe.mlp's default list with the reasons and the run-time fallbacks") {
  using namespace ax_test;
  TempDir dir;
  write_file(dir / "run.toml", "[kernels]\nstrict = false\n");
  auto r = run(axengine() + " plugins explain --config " + (dir / "run.toml") + " --set device.type=cpu");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("from default for moe.mlp") != std::string::npos);
  // Built or not (the plugin needs nvcc), sonicmoe is named with the reason it is passed over on the CPU.
  CHECK((r.output.find("sonicmoe: not registered (no loaded plugin provides it)") != std::string::npos ||
         r.output.find("sonicmoe: needs cuda, device is cpu") != std::string::npos));
  const size_t mlp = r.output.find("from default for moe.mlp");  // the default order: sonicmoe first
  CHECK(r.output.find("sonicmoe: ", mlp) < r.output.find("scattermoe: ", mlp));
}
