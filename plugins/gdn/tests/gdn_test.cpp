// The gdn plugin's tests. On every machine: the built plugin loads through the real loader and registers
// its linear_attention backend as declared; the kernels' block bodies, run on the host one thread per
// block (kernels/chunk_math.cuh, src/host_kernels.cpp), through the same glue as the plugin, equal the
// reference — packed sequences over chunk boundaries, an empty and a length-1 sequence, Hv = 2·Hk, states in
// and out with their gradients, the L2 norm, fp32 and bf16; head dims that are not multiples of the
// micro-tile or the column tile, with the scans' two operand buffers and with one; the shared memory sizes
// against sm_80/86/90's limits and the declines they imply. On a CUDA device (else skipped with a message):
// the CUDA kernels equal the reference and repeat bitwise. The conformance suite's linear_attention problems
// (the contract's cases, docs/ops/linear_attention.md) run against the reference twice: the host twin on the
// CPU (quick grid) and, on a GPU, the CUDA kernels (full grid, every dtype, CUDA-graph capture included).
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <axengine/builtins.hpp>
#include <axengine/conformance.hpp>
#include <axengine/ops/linear_attention.hpp>
#include <axengine/plugin_loader.hpp>
#include <axengine/registry.hpp>

#include "linear_attention.hpp"

namespace {

using ax::ops::LinearAttention;
using ax::ops::LinearAttentionArgs;
using ax::ops::LinearAttentionBackwardArgs;
using ax::ops::LinearAttentionGrads;

bool have_cuda() { return at::hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0; }

std::shared_ptr<LinearAttention> reference() {
  static ax::Registry* reg = [] {
    auto* r = new ax::Registry;
    ax::register_builtins(*r);
    return r;
  }();
  return reg->kernel<LinearAttention>("reference");
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kCPU, at::kDouble), y = b.to(at::kCPU, at::kDouble);
  return ((x - y).norm() / y.norm()).item<double>();
}

struct Case {
  std::vector<int32_t> cu = {0, 70, 70, 71, 200};  // over chunk boundaries, an empty and a length-1 sequence
  int64_t Hk = 2, Hv = 4, Dk = 32, Dv = 40;        // Dv > one 32-column tile of the scan
  bool l2 = true, state = true;
};

struct Call {
  LinearAttentionArgs a;
  LinearAttentionBackwardArgs b;
};

Call make_call(const Case& c, at::ScalarType dt, at::Device dev) {
  at::manual_seed(38);
  const int64_t T = c.cu.back(), N = static_cast<int64_t>(c.cu.size()) - 1;
  Call k;
  LinearAttentionArgs& a = k.a;
  a.q = at::randn({T, c.Hk, c.Dk}).to(dev, dt);
  a.k = at::randn({T, c.Hk, c.Dk}).to(dev, dt);
  a.v = at::randn({T, c.Hv, c.Dv}).to(dev, dt);
  a.g = (-at::softplus(at::randn({T, c.Hv})) * at::rand({c.Hv}) * 0.5).to(dev);
  a.beta = at::sigmoid(at::randn({T, c.Hv})).to(dev, dt);
  a.cu_seqlens = at::tensor(c.cu, at::kInt).to(dev);
  a.qk_l2norm = c.l2;
  if (c.state) {
    a.initial_state = (at::randn({N, c.Hv, c.Dk, c.Dv}) * 0.5).to(dev);
    a.output_final_state = true;
    k.b.grad_final_state = (at::randn({N, c.Hv, c.Dk, c.Dv}) * 0.5).to(dev);
  }
  k.b.grad_out = at::randn({T, c.Hv, c.Dv}).to(dev, dt);
  return k;
}

// The backend against the reference on the same inputs: every output and gradient within `tol`.
void check_against_reference(LinearAttention& op, const Call& k, double tol) {
  auto ref = reference();
  auto r = op.forward(k.a), rr = ref->forward(k.a);
  CHECK(rel_err(r.out, rr.out) < tol);
  if (k.a.output_final_state) CHECK(rel_err(r.final_state, rr.final_state) < tol);
  LinearAttentionBackwardArgs b = k.b;
  b.saved = r.saved;
  LinearAttentionGrads g = op.backward(k.a, b);
  b.saved = rr.saved;
  LinearAttentionGrads gr = ref->backward(k.a, b);
  CHECK(rel_err(g.dq, gr.dq) < tol);
  CHECK(rel_err(g.dk, gr.dk) < tol);
  CHECK(rel_err(g.dv, gr.dv) < tol);
  CHECK(rel_err(g.dg, gr.dg) < tol);
  CHECK(rel_err(g.dbeta, gr.dbeta) < tol);
  CHECK(g.dinitial_state.defined() == k.a.initial_state.defined());
  if (k.a.initial_state.defined()) CHECK(rel_err(g.dinitial_state, gr.dinitial_state) < tol);
}

// The conformance suite's linear_attention problems for `kernels` registered as backend `name` on `device`.
// Returns the failing cases, one a line; counts the passing ones; logs the failing and skipped ones.
std::string certify(const ax::gdn::Kernels& kernels, const std::string& name, const std::string& device, bool quick,
                    int& passed) {
  ax::Registry registry;
  ax::register_builtins(registry);
  ax::Provider p;
  p.info.kind = ax::ProviderKind::kernel;
  p.info.op = LinearAttention::kOp;
  p.info.name = name;
  p.info.plugin = "test";
  p.info.graph_safe = device == "cuda";
  p.info.needs.devices = {device};
  p.info.needs.dtypes = {"fp32", "bf16", "fp16"};
  p.object = ax::gdn::make_linear_attention(kernels);
  registry.add(std::move(p));
  ax::conformance::Options o;
  o.op = LinearAttention::kOp;
  o.backend = name;
  o.device = device;
  o.quick = quick;
  o.on_case = [](const ax::conformance::CaseResult& c) {
    if (c.status != ax::conformance::Status::pass)
      MESSAGE(ax::conformance::to_string(c.status) << " " << c.name << (c.message.empty() ? "" : ": ") << c.message);
  };
  const ax::conformance::Report rep = ax::conformance::run(registry, o);
  std::string bad;
  for (const auto& c : rep.cases)
    if (c.status == ax::conformance::Status::fail) bad += "\n  " + c.name + ": " + c.message;
  passed = rep.count(ax::conformance::Status::pass);
  return bad;
}

}  // namespace

TEST_CASE("gdn plugin: loads and registers its linear_attention backend for CUDA sm_80+") {
  auto registry = std::make_unique<ax::Registry>();
  {
    ax::PluginLoader loader(*registry);
    const ax::PluginReport& r = loader.load_file(AXENGINE_GDN_SO, "test");
    INFO(r.reason);
    REQUIRE(r.status == ax::PluginReport::Status::loaded);
    const ax::Provider* p = registry->find(ax::ProviderKind::kernel, "linear_attention", "gdn");
    REQUIRE(p);
    CHECK(p->info.graph_safe);
    CHECK(p->info.needs.devices == std::vector<std::string>{"cuda"});
    CHECK(p->info.needs.arch_min == 80);
    registry.reset();  // before the loader unloads the plugin's code
  }
}

TEST_CASE("gdn kernels (host twin, one thread per block) equal the reference: packed, GQA, states, L2 norm") {
  auto op = ax::gdn::make_linear_attention(ax::gdn::host_kernels());
  SUBCASE("fp32, states in and out") { check_against_reference(*op, make_call({}, at::kFloat, at::kCPU), 1e-5); }
  SUBCASE("fp32, no norm inside (k unit-norm), no state, Hv = Hk, one long sequence") {
    Case c{.cu = {0, 150}, .Hk = 3, .Hv = 3, .Dk = 16, .Dv = 16, .l2 = false, .state = false};
    Call k = make_call(c, at::kFloat, at::kCPU);
    k.a.k = k.a.k / k.a.k.norm(2, -1, true);
    check_against_reference(*op, k, 1e-5);
  }
  SUBCASE("bf16") { check_against_reference(*op, make_call({}, at::kBFloat16, at::kCPU), 2e-2); }
}

// The host twin with a device's shared memory limit (bytes a block may opt in to): it picks the staging.
ax::gdn::Kernels host_with_limit(int64_t (*limit)(int)) {
  ax::gdn::Kernels k = ax::gdn::host_kernels();
  k.smem_limit = limit;
  return k;
}
constexpr int64_t kSm80Smem = 163 * 1024, kSm86Smem = 99 * 1024, kSm90Smem = 227 * 1024;

TEST_CASE("gdn kernels (host twin): both stagings, ragged micro-tiles and column tiles, short packed chunks") {
  // Dk = 22 and Dv = 37: neither a multiple of the 4 x 2 micro-tile nor of the 32-column tile (the second
  // tile has 5 columns, an odd count); chunks shorter than 64 between packed samples, an empty one.
  const Case ragged{.cu = {0, 20, 83, 83, 90, 150}, .Hk = 1, .Hv = 2, .Dk = 22, .Dv = 37};
  SUBCASE("two operand buffers (overlap)") {
    REQUIRE(ax::gdn::scan_smem_bytes(22, true, true) <= kSm90Smem);
    auto op = ax::gdn::make_linear_attention(ax::gdn::host_kernels());
    check_against_reference(*op, make_call(ragged, at::kFloat, at::kCPU), 1e-5);
  }
  SUBCASE("one operand buffer (a limit below what overlap needs)") {
    auto op = ax::gdn::make_linear_attention(host_with_limit([](int) -> int64_t { return 30 * 1024; }));
    REQUIRE(ax::gdn::scan_smem_bytes(22, true, false) <= 30 * 1024);
    REQUIRE(ax::gdn::scan_smem_bytes(22, false, true) > 30 * 1024);
    check_against_reference(*op, make_call(ragged, at::kFloat, at::kCPU), 1e-5);
  }
  SUBCASE("Dk = 256 at sm_80's limit: the forward single-buffered, the backward too") {
    CHECK(ax::gdn::scan_smem_bytes(256, false, true) > kSm80Smem);
    CHECK(ax::gdn::scan_smem_bytes(256, true, false) <= kSm80Smem);
    auto op = ax::gdn::make_linear_attention(host_with_limit([](int) -> int64_t { return kSm80Smem; }));
    const Case wide{.cu = {0, 70, 75}, .Hk = 1, .Hv = 1, .Dk = 256, .Dv = 34};
    CHECK_FALSE(op->decline(make_call(wide, at::kFloat, at::kCPU).a).has_value());
    check_against_reference(*op, make_call(wide, at::kFloat, at::kCPU), 1e-5);
  }
}

TEST_CASE("gdn: the scans fit sm_90 double-buffered at Qwen's Dk = 128 and Dk = 256, sm_80 single-buffered") {
  for (int dk : {128, 256}) {
    CAPTURE(dk);
    CHECK(ax::gdn::scan_smem_bytes(dk, /*backward=*/true, /*overlap=*/true) <= kSm90Smem);
    CHECK(ax::gdn::scan_smem_bytes(dk, /*backward=*/true, /*overlap=*/false) <= kSm80Smem);
  }
  CHECK(ax::gdn::scan_smem_bytes(128, /*backward=*/true, /*overlap=*/false) <= kSm86Smem);
}

TEST_CASE("gdn kernels (host twin) pass the linear_attention conformance problems on the CPU (quick grid)") {
  int passed = 0;
  const std::string fails = certify(ax::gdn::host_kernels(), "gdn_host", "cpu", /*quick=*/true, passed);
  INFO("failing cases:" << fails);
  CHECK(fails.empty());
  CHECK(passed > 60);  // 4 shapes x 4 variants x fwd/bwd x 3 dtypes, determinism, bad inputs
}

TEST_CASE("gdn: declines key head dims its scan cannot hold") {
  auto op = ax::gdn::make_linear_attention(ax::gdn::host_kernels());
  Call k = make_call({.cu = {0, 3}, .Hk = 1, .Hv = 1, .Dk = ax::gdn::kMaxKeyDim + 8, .Dv = 8}, at::kFloat, at::kCPU);
  auto why = op->decline(k.a);
  REQUIRE(why.has_value());
  CHECK(why->find("key head dim") != std::string::npos);
  CHECK_FALSE(op->decline(make_call({}, at::kFloat, at::kCPU).a).has_value());
  SUBCASE("a key head dim the device's shared memory cannot hold (sm_86's 99 KiB at Dk = 256)") {
    auto small = ax::gdn::make_linear_attention(host_with_limit([](int) -> int64_t { return kSm86Smem; }));
    auto w = small->decline(make_call({.cu = {0, 3}, .Hk = 1, .Hv = 1, .Dk = 256, .Dv = 8}, at::kFloat, at::kCPU).a);
    REQUIRE(w.has_value());
    CHECK(w->find("bytes of shared memory") != std::string::npos);
    CHECK_FALSE(small->decline(make_call({.cu = {0, 3}, .Hk = 1, .Hv = 1, .Dk = 128, .Dv = 8}, at::kFloat, at::kCPU).a));
  }
}

// Counts the calls that reach the wrapped backend (its declines are the wrapped backend's).
struct Counting : LinearAttention {
  std::shared_ptr<LinearAttention> inner;
  int forwards = 0, backwards = 0;
  explicit Counting(std::shared_ptr<LinearAttention> b) : inner(std::move(b)) {}
  std::optional<std::string> decline(const LinearAttentionArgs& a) const override { return inner->decline(a); }

 protected:
  ax::ops::LinearAttentionResult run_forward(const LinearAttentionArgs& a) override {
    ++forwards;
    return inner->forward(a);
  }
  LinearAttentionGrads run_backward(const LinearAttentionArgs& a, const LinearAttentionBackwardArgs& b) override {
    ++backwards;
    return inner->backward(a, b);
  }
};

TEST_CASE("linear_attention_chain: a call gdn declines goes to the next backend, forward and backward") {
  auto gdn = std::make_shared<Counting>(ax::gdn::make_linear_attention(ax::gdn::host_kernels()));
  auto ref = std::make_shared<Counting>(reference());
  auto chain = ax::ops::linear_attention_chain({{"gdn", gdn}, {"reference", ref}});
  auto run = [&](const Call& k) {
    auto r = chain->forward(k.a);
    LinearAttentionBackwardArgs b = k.b;
    b.saved = r.saved;
    chain->backward(k.a, b);
  };
  run(make_call({.cu = {0, 5, 9}, .Hk = 1, .Hv = 2, .Dk = 16, .Dv = 8}, at::kFloat, at::kCPU));
  CHECK(gdn->forwards == 1);
  CHECK(gdn->backwards == 1);
  CHECK(ref->forwards == 0);
  run(make_call({.cu = {0, 5, 9}, .Hk = 1, .Hv = 1, .Dk = ax::gdn::kMaxKeyDim + 8, .Dv = 8}, at::kFloat, at::kCPU));
  CHECK(gdn->forwards == 1);
  CHECK(ref->forwards == 1);
  CHECK(ref->backwards == 1);
}

TEST_CASE("gdn kernels (CUDA): equal the reference, repeat bitwise") {
  if (!have_cuda()) {
    MESSAGE("skipped: needs a CUDA device (no CUDA device present)");
    return;
  }
  auto op = ax::gdn::make_linear_attention(ax::gdn::cuda_kernels());
  const at::Device dev(at::kCUDA, 0);
  check_against_reference(*op, make_call({}, at::kFloat, dev), 1e-5);
  check_against_reference(*op, make_call({}, at::kBFloat16, dev), 2e-2);
  // Qwen3.5's linear-layer heads: Dk = Dv = 128, Hv = 2·Hk.
  Call big = make_call({.cu = {0, 300, 301, 700}, .Hk = 4, .Hv = 8, .Dk = 128, .Dv = 128}, at::kBFloat16, dev);
  check_against_reference(*op, big, 2e-2);
  LinearAttentionBackwardArgs b = big.b;
  auto g1 = op->backward(big.a, b), g2 = op->backward(big.a, b);
  CHECK(at::equal(g1.dk, g2.dk));
  CHECK(at::equal(g1.dg, g2.dg));
}

TEST_CASE("gdn kernels (CUDA) pass the linear_attention conformance problems (full grid, graph capture)") {
  if (!have_cuda()) {
    MESSAGE("skipped: needs a CUDA device (no CUDA device present)");
    return;
  }
  int passed = 0;
  const std::string fails = certify(ax::gdn::cuda_kernels(), "gdn", "cuda", /*quick=*/false, passed);
  INFO("failing cases:" << fails);
  CHECK(fails.empty());
  CHECK(passed > 100);
}
