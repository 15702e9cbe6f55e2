// sonicmoe plugin tests. CPU (every build with the plugin): selection passes sonicmoe over on GPUs other
// than Hopper (AXENGINE_ARCH), for fp16 and for quantised weights, with the reason `plugins explain`
// prints, and scattermoe serves; the run-time decline names the shapes outside the kernels' tiles.
// CUDA sm_90: the moe.mlp conformance problems (quick grid; AXENGINE_SONICMOE_FULL=1: the full grid),
// where the tile-aligned problems must all run (pass) and the others are declined (skip).
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <axengine/builtins.hpp>
#include <axengine/conformance.hpp>
#include <axengine/device.hpp>
#include <axengine/ops/moe_mlp.hpp>
#include <axengine/ops/quant.hpp>
#include <axengine/plugin_loader.hpp>
#include <axengine/registry.hpp>
#include <axengine/selection.hpp>
#include <axengine/strings.hpp>


namespace {

using ax::ops::MoeMlp;
using ax::ops::MoeMlpArgs;

std::string plugin_file(const char* name) { return std::string(AXENGINE_PLUGIN_DIR) + "/axengine_" + name + ".so"; }

// Builtins plus the given plugins; nullptr (with a message) when a plugin was not built (no nvcc).
struct Loaded {
  std::unique_ptr<ax::Registry> registry = std::make_unique<ax::Registry>();
  std::unique_ptr<ax::PluginLoader> loader;
  ~Loaded() { registry.reset(); }  // the objects' code lives in the plugins: gone before they unload
};
std::unique_ptr<Loaded> load(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (!std::filesystem::exists(plugin_file(n))) return nullptr;
  auto l = std::make_unique<Loaded>();
  ax::register_builtins(*l->registry);
  l->loader = std::make_unique<ax::PluginLoader>(*l->registry);
  for (const char* n : names) {
    const ax::PluginReport& r = l->loader->load_file(plugin_file(n), "test");
    INFO(plugin_file(n) << ": " << r.reason);
    REQUIRE(r.status == ax::PluginReport::Status::loaded);
  }
  return l;
}

std::string verdict(const ax::Resolution& r, const std::string& backend) {
  for (const auto& c : r.candidates)
    if (c.backend == backend) return c.verdict;
  return "(not a candidate)";
}

ax::DeviceInfo device_as(const char* arch) {
  ::setenv("AXENGINE_ARCH", arch, 1);
  ax::DeviceInfo dev = ax::detect_device("auto", "");
  ::unsetenv("AXENGINE_ARCH");
  return dev;
}

// A small valid block on the CPU (decline reads shapes, dtypes and formats only): ENK weights.
MoeMlpArgs block(int64_t H, int64_t I, int64_t r, at::ScalarType dt = at::kBFloat16) {
  const int64_t E = 4, k = 2, T = 6, M = T * k;
  auto o = at::TensorOptions().dtype(dt);
  MoeMlpArgs a;
  a.x = at::randn({T, H}, o);
  a.routing.sorted_expert_idxs = at::arange(M, at::kLong).div(M / E, "floor");
  a.routing.sorted_scattered_idxs = at::arange(M, at::kLong);
  a.routing.expert_offsets = (at::arange(1, E + 1, at::kLong) * (M / E));
  a.routing.top_k = k;
  a.gates = at::rand({T, k}, o);
  a.layout = ax::ops::ExpertLayout::ENK;
  a.gate_up = ax::ops::WeightTensor::dense(at::randn({E, 2 * I, H}, o));
  a.down = ax::ops::WeightTensor::dense(at::randn({E, H, I}, o));
  if (r > 0) {
    a.gate_up_lora = {at::randn({r * E, H}, o), at::randn({2 * I, r * E}, o), 0.5};
    a.down_lora = {at::randn({r * E, I}, o), at::randn({H, r * E}, o), 2.0};
  }
  return a;
}

bool cuda_sm90() {
  if (!at::hasCUDA() || at::detail::getCUDAHooks().deviceCount() == 0) return false;
  return ax::detect_device("cuda", "").arch == 90;
}

}  // namespace

TEST_CASE("sonicmoe: selection passes it over off Hopper, for fp16 and quantised weights; scattermoe serves") {
  auto l = load({"sonicmoe", "scattermoe"});
  if (!l) {
    MESSAGE("skipped: the sonicmoe / scattermoe plugins were not built (no nvcc)");
    return;
  }
  const ax::Provider* p = l->registry->find(ax::ProviderKind::kernel, "moe.mlp", "sonicmoe");
  REQUIRE(p != nullptr);
  CHECK(p->info.needs.arch_min == 90);
  CHECK(p->info.needs.arch_max == 90);
  // No config list: the default puts sonicmoe first; every other GPU, fp16 and quantised experts fall back to
  // scattermoe with the reason, and no config is edited per machine.
  const ax::KernelPreferences defaults;
  for (const char* arch : {"sm_80", "sm_89", "sm_100", "sm_120"}) {
    CAPTURE(arch);
    const ax::DeviceInfo dev = device_as(arch);
    const ax::Resolution r = ax::resolve_backend(*l->registry, defaults, "moe.mlp", {dev, "bf16", "dense", "ENK"});
    CHECK(r.list_source == "default for moe.mlp");
    CHECK(r.chosen == "scattermoe");
    CHECK(verdict(r, "sonicmoe") == ax::str("needs sm_90..sm_90, device is ", arch));
  }
  const ax::DeviceInfo h200 = device_as("sm_90");
  ax::Resolution r = ax::resolve_backend(*l->registry, defaults, "moe.mlp", {h200, "bf16", "dense", "ENK"});
  CHECK(r.chosen == "sonicmoe");
  CHECK(r.fallbacks == std::vector<std::string>{"scattermoe", "reference"});
  r = ax::resolve_backend(*l->registry, defaults, "moe.mlp", {h200, "bf16", "dense", "EKN"});
  CHECK(r.chosen == "sonicmoe");
  for (const char* fmt : {"nf4", "mxfp4", "nvfp4"}) {
    CAPTURE(fmt);
    r = ax::resolve_backend(*l->registry, defaults, "moe.mlp", {h200, "bf16", fmt, "ENK"});
    CHECK(r.chosen == "scattermoe");
    CHECK(verdict(r, "sonicmoe") == ax::str("needs weight format dense, asked for ", fmt));
  }
  r = ax::resolve_backend(*l->registry, defaults, "moe.mlp", {h200, "fp16", "dense", "ENK"});
  CHECK(r.chosen == "scattermoe");
  CHECK(verdict(r, "sonicmoe") == "needs dtype bf16, asked for fp16");
  // A config list wins: scattermoe first on an H200, sonicmoe behind it.
  ax::KernelPreferences scatter_first;
  scatter_first.prefer["moe.mlp"] = {"scattermoe", "sonicmoe", "reference"};
  r = ax::resolve_backend(*l->registry, scatter_first, "moe.mlp", {h200, "bf16", "dense", "ENK"});
  CHECK(r.chosen == "scattermoe");
  CHECK(r.fallbacks == std::vector<std::string>{"sonicmoe", "reference"});
}

TEST_CASE("sonicmoe: decline names the calls outside its tiles and formats") {
  auto l = load({"sonicmoe"});
  if (!l) {
    MESSAGE("skipped: the sonicmoe plugin was not built (no nvcc)");
    return;
  }
  auto be = l->registry->kernel<MoeMlp>("sonicmoe");
  REQUIRE(be);
  CHECK(!be->decline(block(128, 192, 16)));  // H, I multiples of 64, rank <= 64: served
  CHECK(!be->decline(block(64, 64, 3)));     // odd ranks are padded
  CHECK(!be->decline(block(64, 64, 0)));     // no LoRA
  CHECK(be->decline(block(40, 64, 4)) == std::optional<std::string>("H = 40 is not a multiple of 64 (the K tile)"));
  CHECK(be->decline(block(64, 24, 4)) == std::optional<std::string>("I = 24 is not a multiple of 64 (the K tile)"));
  CHECK(be->decline(block(64, 64, 80)) == std::optional<std::string>("gate_up LoRA rank 80 > 64 (one K tile)"));
  CHECK(be->decline(block(64, 64, 4, at::kFloat)) == std::optional<std::string>("dtype Float (bf16 only)"));
  MoeMlpArgs q = block(64, 64, 4);
  q.down = ax::ops::quantize_nf4(q.down.values.to(at::kFloat), 64, false);  // dense gate_up, nf4 down
  auto why = be->decline(q);
  REQUIRE(why);
  CHECK(why->find("down is nf4 (dense weights only") == 0);
  MoeMlpArgs lu = block(64, 64, 4);
  lu.down_lora = {at::randn({65 * 4, 64}, at::kBFloat16), at::randn({64, 65 * 4}, at::kBFloat16), 1.0};
  CHECK(be->decline(lu) == std::optional<std::string>("down LoRA rank 65 > 64 (one K tile)"));
}

TEST_CASE("sonicmoe passes the moe.mlp conformance problems (CUDA sm_90)") {
  if (!cuda_sm90()) {
    MESSAGE("skipped: needs a CUDA sm_90 device (Hopper); the CPU cases above check selection and declines");
    return;
  }
  auto l = load({"sonicmoe"});
  REQUIRE(l);  // on a Hopper machine the plugin must have been built
  ax::conformance::Options o;
  o.op = "moe.mlp";
  o.backend = "sonicmoe";
  o.device = "cuda";
  const char* full = std::getenv("AXENGINE_SONICMOE_FULL");
  o.quick = !(full && std::string(full) == "1");
  o.on_case = [](const ax::conformance::CaseResult& c) {
    if (c.status != ax::conformance::Status::skip || c.name.find("H=64") != std::string::npos ||
        c.name.find("H=128") != std::string::npos) {
      const std::string line = std::string(ax::conformance::to_string(c.status)) + " " + c.name +
                               (c.message.empty() ? std::string() : ": " + c.message);
      MESSAGE(line);
    }
  };
  ax::conformance::Report rep = ax::conformance::run(*l->registry, o);
  std::string fails;
  int aligned_skips = 0;
  for (const auto& c : rep.cases) {
    if (c.status == ax::conformance::Status::fail) fails += "\n  " + c.name + ": " + c.message;
    // Tile-aligned problems are sonicmoe's to serve: none may be skipped as declined.
    const bool aligned = c.name.find("H=64,") != std::string::npos || c.name.find("H=128,") != std::string::npos;
    if (aligned && c.status == ax::conformance::Status::skip && c.message.find("declines") != std::string::npos) {
      ++aligned_skips;
      fails += "\n  (declined) " + c.name + ": " + c.message;
    }
  }
  INFO("failing cases:" << fails);
  CHECK(fails.empty());
  CHECK(aligned_skips == 0);
  CHECK(rep.count(ax::conformance::Status::pass) > 40);
}

// The conformance problems are small: each CTA of the persistent kernels gets at most one tile. Blocks the
// size of a training step give every CTA several tiles, and experts of ~256 rows a short last row tile
// (the paths a kernel change can break without the conformance noticing: docs/plugins/sonicmoe.md tells of
// one that hung only there). Random top-k routing, LoRA on both projections, both activations and layouts,
// forward and backward against scattermoe (itself held to the conformance) at the bf16 tolerance.
TEST_CASE("sonicmoe: blocks with several tiles per CTA and short last tiles agree with scattermoe (CUDA sm_90)") {
  if (!cuda_sm90()) {
    MESSAGE("skipped: needs a CUDA sm_90 device (Hopper)");
    return;
  }
  auto l = load({"sonicmoe", "scattermoe"});
  REQUIRE(l);
  auto sonic = l->registry->kernel<MoeMlp>("sonicmoe");
  auto scatter = l->registry->kernel<MoeMlp>("scattermoe");
  REQUIRE(sonic);
  REQUIRE(scatter);
  struct Case {
    int64_t E, T, k, H, I, r;
    bool gpt_oss;
  };
  // 256 rows an expert on average (2-3 row tiles, the last often short); 160-320 tiles for 132 CTAs.
  for (const Case c : {Case{32, 2048, 4, 512, 256, 16, false}, Case{16, 2048, 2, 256, 256, 8, true}}) {
    CAPTURE(c.gpt_oss);
    at::manual_seed(7);
    auto o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    MoeMlpArgs a;
    a.x = at::randn({c.T, c.H}, o);
    const at::Tensor experts = std::get<1>(at::rand({c.T, c.E}, o.dtype(at::kFloat)).topk(c.k, 1)).reshape({-1});
    const auto sorted = experts.sort(/*stable=*/true, 0, false);
    a.routing.sorted_expert_idxs = std::get<0>(sorted);
    a.routing.sorted_scattered_idxs = std::get<1>(sorted);
    a.routing.expert_offsets = experts.bincount({}, c.E).cumsum(0);
    a.routing.top_k = c.k;
    a.gates = at::softmax(at::randn({c.T, c.k}, o.dtype(at::kFloat)), 1).to(at::kBFloat16);
    a.layout = c.gpt_oss ? ax::ops::ExpertLayout::EKN : ax::ops::ExpertLayout::ENK;
    const double sh = 1 / std::sqrt(double(c.H)), si = 1 / std::sqrt(double(c.I));
    a.gate_up = ax::ops::WeightTensor::dense(
        (c.gpt_oss ? at::randn({c.E, c.H, 2 * c.I}, o) : at::randn({c.E, 2 * c.I, c.H}, o)) * sh);
    a.down = ax::ops::WeightTensor::dense((c.gpt_oss ? at::randn({c.E, c.I, c.H}, o) : at::randn({c.E, c.H, c.I}, o)) * si);
    a.gate_up_lora = {at::randn({c.r * c.E, c.H}, o) * sh, at::randn({2 * c.I, c.r * c.E}, o) * 0.1, 2.0};
    a.down_lora = {at::randn({c.r * c.E, c.I}, o) * si, at::randn({c.H, c.r * c.E}, o) * 0.1, 2.0};
    if (c.gpt_oss) {
      a.activation = ax::ops::MoeActivation::clamped_glu;
      a.packing = ax::ops::GluPacking::interleaved;
      a.gate_up_bias = at::randn({c.E, 2 * c.I}, o) * 0.1;
      a.down_bias = at::randn({c.E, c.H}, o) * 0.1;
    }
    a.check_values = false;
    const at::Tensor dy = at::randn({c.T, c.H}, o);
    auto run = [&](MoeMlp& be) {
      ax::ops::MoeMlpResult r = be.forward(a);
      ax::ops::MoeMlpBackwardArgs b;
      b.grad_y = dy;
      b.saved = r.saved;
      return std::make_pair(r.y, be.backward(a, b));
    };
    const auto [ys, gs] = run(*sonic);
    const auto [yc, gc] = run(*scatter);
    auto rel = [](const at::Tensor& x, const at::Tensor& y) {
      const at::Tensor a = x.to(at::kDouble), b = y.to(at::kDouble);
      return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
    };
    CHECK(rel(ys, yc) < 2e-2);
    CHECK(rel(gs.dx, gc.dx) < 2e-2);
    CHECK(rel(gs.dgates, gc.dgates) < 2e-2);
    CHECK(rel(gs.dgate_up_lora_a, gc.dgate_up_lora_a) < 2e-2);
    CHECK(rel(gs.dgate_up_lora_b, gc.dgate_up_lora_b) < 2e-2);
    CHECK(rel(gs.ddown_lora_a, gc.ddown_lora_a) < 2e-2);
    CHECK(rel(gs.ddown_lora_b, gc.ddown_lora_b) < 2e-2);
  }
}
