// The autograd adapters of the Gated DeltaNet ops (models/autograd_ops.hpp: linear_attention, causal_conv1d):
// the gradients autograd computes through them are the op's own backward (initial and final states
// included), inputs that do not require grad get none, and a packed row of two samples is the two samples run
// alone (the recurrent state and the conv window restart at each cu_seqlens boundary), forward and backward.
#include <doctest/doctest.h>

#include <torch/csrc/autograd/autograd.h>

#include "axengine/builtins.hpp"
#include "axengine/registry.hpp"
#include "models/autograd_ops.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;

namespace {

const Registry& registry() {
  static Registry reg = [] {
    Registry r;
    register_builtins(r);
    return r;
  }();
  return reg;
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

at::Tensor offsets(const std::vector<int64_t>& lens) {
  std::vector<int32_t> cu{0};
  for (auto l : lens) cu.push_back(cu.back() + static_cast<int32_t>(l));
  return at::tensor(cu, at::kInt);
}

const std::vector<int64_t> kLens = {5, 9};
constexpr int64_t kHk = 2, kHv = 4, kDk = 4, kDv = 3, kC = 6, kW = 4;

struct LaInputs {
  at::Tensor q, k, v, g, beta, init, go, gf;
};

LaInputs la_inputs() {
  at::manual_seed(3);
  const int64_t T = 14, N = 2;
  LaInputs d;
  d.q = at::randn({T, kHk, kDk}, at::kDouble);
  d.k = at::randn({T, kHk, kDk}, at::kDouble);
  d.v = at::randn({T, kHv, kDv}, at::kDouble);
  d.g = -at::softplus(at::randn({T, kHv}, at::kDouble));
  d.beta = at::sigmoid(at::randn({T, kHv}, at::kDouble));
  d.init = at::randn({N, kHv, kDk, kDv}, at::kDouble);
  d.go = at::randn({T, kHv, kDv}, at::kDouble);
  d.gf = at::randn({N, kHv, kDk, kDv}, at::kDouble);
  return d;
}

// {out, final_state, grads of q, k, v, g, beta, init} of rows [r0, r0 + len) (all of kLens when len < 0)
// through the autograd adapter, with the loss Σ out·go + Σ final·gf.
std::vector<at::Tensor> la_through_autograd(const LaInputs& d, int64_t b) {
  auto op = registry().kernel<ops::LinearAttention>("reference");
  REQUIRE(op);
  int64_t r0 = 0, len = 0;
  for (int64_t i = 0; i < b; ++i) r0 += kLens[i];
  len = b < 0 ? d.q.size(0) : kLens[b];
  if (b < 0) r0 = 0;
  auto rows = [&](const at::Tensor& t) { return t.narrow(0, r0, len); };
  auto seqs = [&](const at::Tensor& t) { return b < 0 ? t : t.narrow(0, b, 1); };
  at::Tensor q = leaf(rows(d.q)), k = leaf(rows(d.k)), v = leaf(rows(d.v)), g = leaf(rows(d.g)), beta = leaf(rows(d.beta));
  at::Tensor init = leaf(seqs(d.init));
  ops::LinearAttentionArgs a;
  a.q = q, a.k = k, a.v = v, a.g = g, a.beta = beta;
  a.cu_seqlens = b < 0 ? offsets(kLens) : offsets({len});
  a.qk_l2norm = true;
  a.initial_state = init;
  a.output_final_state = true;
  auto r = autograd::linear_attention(op, a);
  at::Tensor loss = (r.out * rows(d.go)).sum() + (r.final_state * seqs(d.gf)).sum();
  loss.backward();
  return {r.out.detach(), r.final_state.detach(), q.grad(), k.grad(), v.grad(), g.grad(), beta.grad(), init.grad()};
}

}  // namespace

TEST_CASE("autograd linear_attention: gradients are the op's backward; packed samples equal the samples alone") {
  LaInputs d = la_inputs();
  auto packed = la_through_autograd(d, -1);
  // The op called directly, forward and backward.
  auto op = registry().kernel<ops::LinearAttention>("reference");
  ops::LinearAttentionArgs a;
  a.q = d.q, a.k = d.k, a.v = d.v, a.g = d.g, a.beta = d.beta;
  a.cu_seqlens = offsets(kLens);
  a.qk_l2norm = true;
  a.initial_state = d.init;
  a.output_final_state = true;
  auto r = op->forward(a);
  ops::LinearAttentionBackwardArgs bw;
  bw.grad_out = d.go;
  bw.grad_final_state = d.gf;
  auto g = op->backward(a, bw);
  CHECK(at::equal(packed[0], r.out));
  CHECK(at::equal(packed[1], r.final_state));
  const std::vector<at::Tensor> want = {g.dq, g.dk, g.dv, g.dg, g.dbeta, g.dinitial_state};
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    REQUIRE(packed[2 + i].defined());
    CHECK(test::rel_err(packed[2 + i], want[i]) < 1e-12);
  }
  // Each sample alone: the same rows, states and gradients (nothing crosses the boundary at row 5).
  for (int64_t b = 0; b < 2; ++b) {
    CAPTURE(b);
    auto alone = la_through_autograd(d, b);
    const int64_t r0 = b == 0 ? 0 : kLens[0];
    CHECK(test::rel_err(alone[0], packed[0].narrow(0, r0, kLens[b])) < 1e-12);
    CHECK(test::rel_err(alone[1], packed[1].narrow(0, b, 1)) < 1e-12);
    for (int i = 2; i < 7; ++i) CHECK(test::rel_err(alone[i], packed[i].narrow(0, r0, kLens[b])) < 1e-12);
    CHECK(test::rel_err(alone[7], packed[7].narrow(0, b, 1)) < 1e-12);
  }
  // Only v requires grad, no final state: the others get no gradient and the call has one output.
  {
    at::Tensor v = leaf(d.v);
    ops::LinearAttentionArgs a2 = a;
    a2.v = v;
    a2.initial_state = at::Tensor();
    a2.output_final_state = false;
    auto r2 = autograd::linear_attention(op, a2);
    CHECK_FALSE(r2.final_state.defined());
    auto grads = torch::autograd::grad({r2.out}, {v}, {d.go});
    ops::LinearAttentionBackwardArgs bw2;
    bw2.grad_out = d.go;
    CHECK(test::rel_err(grads[0], op->backward(a2, bw2).dv) < 1e-12);
  }
}

TEST_CASE("autograd causal_conv1d: gradients are the op's backward; the window restarts at each packed sample") {
  auto op = registry().kernel<ops::CausalConv1d>("reference");
  REQUIRE(op);
  at::manual_seed(5);
  const int64_t T = 14;
  at::Tensor x = at::randn({T, kC}, at::kDouble), w = at::randn({kC, kW}, at::kDouble);
  at::Tensor init = at::randn({2, kW - 1, kC}, at::kDouble), gy = at::randn({T, kC}, at::kDouble);
  at::Tensor gf = at::randn({2, kW - 1, kC}, at::kDouble);
  auto run = [&](const at::Tensor& xs, const at::Tensor& is, const at::Tensor& cu, const at::Tensor& gys, const at::Tensor& gfs) {
    at::Tensor lx = leaf(xs), li = leaf(is);
    ops::CausalConv1dArgs a;
    a.x = lx, a.weight = w, a.cu_seqlens = cu, a.initial_state = li, a.output_final_state = true;
    auto r = autograd::causal_conv1d(op, a);
    ((r.y * gys).sum() + (r.final_state * gfs).sum()).backward();
    return std::vector<at::Tensor>{r.y.detach(), r.final_state.detach(), lx.grad(), li.grad()};
  };
  auto packed = run(x, init, offsets(kLens), gy, gf);
  ops::CausalConv1dArgs a;
  a.x = x, a.weight = w, a.cu_seqlens = offsets(kLens), a.initial_state = init, a.output_final_state = true;
  auto r = op->forward(a);
  ops::CausalConv1dBackwardArgs bw;
  bw.grad_y = gy;
  bw.grad_final_state = gf;
  auto g = op->backward(a, bw);
  CHECK(at::equal(packed[0], r.y));
  CHECK(at::equal(packed[1], r.final_state));
  CHECK(test::rel_err(packed[2], g.dx) < 1e-12);
  CHECK(test::rel_err(packed[3], g.dinitial_state) < 1e-12);
  int64_t r0 = 0;
  for (int64_t b = 0; b < 2; ++b) {
    CAPTURE(b);
    const int64_t n = kLens[b];
    auto alone = run(x.narrow(0, r0, n), init.narrow(0, b, 1), offsets({n}), gy.narrow(0, r0, n), gf.narrow(0, b, 1));
    CHECK(test::rel_err(alone[0], packed[0].narrow(0, r0, n)) < 1e-12);
    CHECK(test::rel_err(alone[1], packed[1].narrow(0, b, 1)) < 1e-12);
    CHECK(test::rel_err(alone[2], packed[2].narrow(0, r0, n)) < 1e-12);
    CHECK(test::rel_err(alone[3], packed[3].narrow(0, b, 1)) < 1e-12);
    r0 += n;
  }
}
