// The gdn plugin's tests. On every machine: the built plugin loads through the real loader and registers
// its linear_attention backend as declared; the kernels' block bodies, run on the host one thread per
// block (kernels/chunk_math.cuh, src/host_kernels.cpp), through the same glue as the plugin, equal the
// reference — packed sequences over chunk boundaries, an empty and a length-1 sequence, Hv = 2·Hk, states in
// and out with their gradients, the L2 norm, fp32 and bf16. On a CUDA device (else skipped with a message):
// the CUDA kernels equal the reference and repeat bitwise. The full grid on the GPU is CTest gdn_conformance.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <axengine/builtins.hpp>
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

TEST_CASE("gdn: declines key head dims its scan cannot hold") {
  auto op = ax::gdn::make_linear_attention(ax::gdn::host_kernels());
  Call k = make_call({.cu = {0, 3}, .Hk = 1, .Hv = 1, .Dk = ax::gdn::kMaxKeyDim + 8, .Dv = 8}, at::kFloat, at::kCPU);
  auto why = op->decline(k.a);
  REQUIRE(why.has_value());
  CHECK(why->find("key head dim") != std::string::npos);
  CHECK_FALSE(op->decline(make_call({}, at::kFloat, at::kCPU).a).has_value());
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
