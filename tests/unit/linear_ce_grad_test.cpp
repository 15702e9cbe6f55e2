// linear_ce's gradient in the forward (LinearCeArgs::grad_in_forward, ops/linear_ce.hpp): the aten
// backend's saved unit gradient against the recomputing backward and the reference; the backward from
// `saved` never reads W; the autograd adapter turns the flag on exactly when a backward will follow and
// hands `saved` through, also inside and outside activation-checkpointing recompute. bf16/fp16 accuracy
// of the path is the conformance suite's (linear_ce/fwd+bwd/.../grad_in_forward).
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "axengine/ops/linear_ce.hpp"
#include "axengine/registry.hpp"
#include "models/autograd_ops.hpp"
#include "models/recompute.hpp"
#include "ops/aten/register_fusions.hpp"
#include "ops/reference/register.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

std::shared_ptr<LinearCe> reference() {
  static Registry reg = [] {
    Registry r;
    register_reference_kernels(r);
    return r;
  }();
  const Provider* p = reg.find(ProviderKind::kernel, LinearCe::kOp, "reference");
  REQUIRE(p);
  return std::static_pointer_cast<LinearCe>(p->object);
}

at::Tensor rnd(at::IntArrayRef s, at::ScalarType dt = at::kFloat) { return at::randn(s, at::TensorOptions().dtype(dt)); }
at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

// Records what the adapter passed, then runs the aten backend (which honours the flag).
struct SpyLinearCe final : LinearCe {
  std::shared_ptr<LinearCe> inner = make_aten_linear_ce(int64_t(7) * 4 * 29);  // a few chunks
  std::vector<bool> forward_flags;
  std::vector<std::size_t> backward_saved;

 protected:
  LinearCeResult run_forward(const LinearCeArgs& a) override {
    forward_flags.push_back(a.grad_in_forward);
    return inner->forward(a);
  }
  at::Tensor run_backward(const LinearCeArgs& a, const LinearCeBackwardArgs& b) override {
    backward_saved.push_back(b.saved.size());
    return inner->backward(a, b);
  }
};

}  // namespace

TEST_CASE("linear_ce grad_in_forward: aten's saved unit gradient gives the recomputed dh, without reading W") {
  at::manual_seed(11);
  auto ref = reference();
  const int64_t T = 37, H = 24, V = 50;
  at::Tensor h = rnd({T, H}), w = rnd({V, H}) * 3, gl = rnd({T}).abs();
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong);
  tgt[0] = -100;
  tgt[T - 1] = -100;
  LinearCeArgs plain{h, w, tgt, -100, true};
  LinearCeArgs in_fwd = plain;
  in_fwd.grad_in_forward = true;
  const at::Tensor want_dh = ref->backward(plain, {gl, ref->forward(plain).lse});

  // The reference ignores the flag: nothing saved, and its backward recomputes.
  CHECK(ref->forward(in_fwd).saved.empty());

  for (int64_t bytes : {int64_t(1), int64_t(20 * V * 4), kAtenLinearCeChunkBytes}) {
    CAPTURE(bytes);
    auto op = make_aten_linear_ce(bytes);
    auto base = op->forward(plain);
    CHECK(base.saved.empty());
    auto got = op->forward(in_fwd);
    // The flag adds the gradient; loss and lse are the same computation.
    CHECK(at::equal(got.loss, base.loss));
    CHECK(at::equal(got.lse, base.lse));
    REQUIRE(got.saved.size() == 1);
    const at::Tensor unit = got.saved[0];
    CHECK((unit.sizes() == h.sizes()));
    CHECK((unit.scalar_type() == h.scalar_type()));
    CHECK(unit[0].abs().sum().item<float>() == 0.0f);

    LinearCeBackwardArgs b{gl, got.lse, got.saved};
    at::Tensor dh = op->backward(in_fwd, b);
    CHECK(test::rel_err(dh, want_dh) < 1e-6);
    CHECK(dh[0].abs().sum().item<float>() == 0.0f);
    CHECK(dh[T - 1].abs().sum().item<float>() == 0.0f);
    // fp32: the unit gradient's rounding is a no-op, so dh is its fp32 multiply by grad_loss exactly.
    CHECK(at::equal(dh, unit * gl.masked_fill(tgt.eq(-100), 0).unsqueeze(1)));
    // The saved tensor is an input of the backward: left as the forward wrote it.
    CHECK(at::equal(unit, op->forward(in_fwd).saved[0]));
    CHECK(at::equal(dh, op->backward(in_fwd, b)));

    // With `saved` the backward does not touch W: another W of the same shape changes nothing, while the
    // recomputing backward follows it.
    LinearCeArgs other_w = in_fwd;
    other_w.weight = at::zeros_like(w);
    CHECK(at::equal(op->backward(other_w, b), dh));
    CHECK(op->backward(other_w, {gl, got.lse}).abs().sum().item<float>() == 0.0f);

    // An ignored row's grad_loss never reaches dh (0 there even for a NaN grad_loss, as the recompute).
    at::Tensor nan_gl = gl.clone();
    nan_gl[0] = std::numeric_limits<float>::quiet_NaN();
    CHECK(op->backward(in_fwd, {nan_gl, got.lse, got.saved})[0].abs().sum().item<float>() == 0.0f);
  }
}

TEST_CASE("linear_ce grad_in_forward: bf16 saved path within the contract tolerance of the reference") {
  at::manual_seed(12);
  auto ref = reference();
  auto op = make_aten_linear_ce(int64_t(9) * 4 * 301);
  const int64_t T = 29, H = 64, V = 301;
  at::Tensor h = rnd({T, H}).to(at::kBFloat16), w = (rnd({V, H}) * (3.0 / 8)).to(at::kBFloat16);
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong), gl = at::full({T}, 1.0f / T);
  tgt[5] = -100;
  LinearCeArgs a{h, w, tgt, -100, true, true};
  auto r = op->forward(a);
  REQUIRE(r.saved.size() == 1);
  CHECK((r.saved[0].scalar_type() == at::kBFloat16));
  at::Tensor dh = op->backward(a, {gl, r.lse, r.saved});
  CHECK((dh.scalar_type() == at::kBFloat16));
  at::Tensor want = ref->backward(a, {gl, ref->forward(a).lse});
  CHECK(test::rel_err(dh.to(at::kFloat), want.to(at::kFloat)) < 2e-2);  // the bf16 backward tolerance
  CHECK(dh[5].abs().sum().item<float>() == 0.0f);
}

TEST_CASE("linear_ce adapter: grad_in_forward exactly when a backward will follow; saved passed through") {
  at::manual_seed(13);
  auto spy = std::make_shared<SpyLinearCe>();
  auto ref = reference();
  const int64_t T = 19, H = 16, V = 29;
  at::Tensor h0 = rnd({T, H}), w = rnd({V, H}), gl = rnd({T}).abs();
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong);
  tgt[2] = -100;

  at::Tensor h = leaf(h0);
  at::Tensor loss = autograd::linear_ce(spy, LinearCeArgs{h, w, tgt, -100, false});
  REQUIRE(spy->forward_flags == std::vector<bool>{true});
  (loss * gl).sum().backward({}, /*retain_graph=*/true);
  CHECK(spy->backward_saved == std::vector<std::size_t>{1});
  LinearCeArgs plain{h0, w, tgt, -100, true};
  at::Tensor want = ref->backward(plain, {gl, ref->forward(plain).lse});
  CHECK(test::rel_err(h.grad(), want) < 1e-6);
  CHECK(test::rel_err(loss.detach(), ref->forward(plain).loss) < 1e-6);
  // The unit gradient was released after its one use: a second backward through the retained graph
  // recomputes, to the same gradient (accumulated: twice).
  (loss * gl).sum().backward();
  CHECK(spy->backward_saved == std::vector<std::size_t>{1, 0});
  CHECK(test::rel_err(h.grad(), want * 2) < 1e-6);

  {  // evaluation: no grad mode, even for an h that requires grad
    at::NoGradGuard no_grad;
    autograd::linear_ce(spy, LinearCeArgs{leaf(h0), w, tgt, -100, false, true});
  }
  // a frozen h: nothing to differentiate
  autograd::linear_ce(spy, LinearCeArgs{h0, w, tgt, -100, false, true});
  CHECK(spy->forward_flags == std::vector<bool>{true, false, false});
}

TEST_CASE("linear_ce adapter under recompute: inside the recomputed function and after it, the same gradients") {
  // The engine's LM head sits after the recomputed layers; a function that ends in linear_ce must work too:
  // its first forward runs without grad mode (no flag, nothing saved), the recomputation in backward with
  // it (flag on, saved used).
  at::manual_seed(14);
  const int64_t T = 13, H = 16, V = 29;
  at::Tensor x0 = rnd({T, H}), P0 = rnd({H, H}) * 0.3, head = rnd({V, H});
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong);
  tgt[4] = -100;
  std::vector<at::Tensor> grads;
  std::vector<std::vector<bool>> flags;
  for (int mode = 0; mode < 3; ++mode) {  // 0: plain, 1: layer recomputed, linear_ce after; 2: both recomputed
    CAPTURE(mode);
    auto spy = std::make_shared<SpyLinearCe>();
    at::Tensor P = leaf(P0), x = leaf(x0);
    auto layer = [=](const at::Tensor& in) { return std::vector<at::Tensor>{at::tanh(at::matmul(in, P)) + in}; };
    auto with_ce = [=](const at::Tensor& in) {
      return std::vector<at::Tensor>{autograd::linear_ce(spy, LinearCeArgs{layer(in)[0], head, tgt, -100, false})};
    };
    at::Tensor loss = mode == 0   ? with_ce(x)[0]
                      : mode == 1 ? autograd::linear_ce(spy, LinearCeArgs{autograd::recompute(layer, x)[0], head, tgt,
                                                                            -100, false})
                                  : autograd::recompute(with_ce, x)[0];
    loss.sum().backward();
    REQUIRE(P.grad().defined());
    grads.push_back(P.grad());
    flags.push_back(spy->forward_flags);
    CHECK(spy->backward_saved == std::vector<std::size_t>{1});
  }
  CHECK(flags[0] == std::vector<bool>{true});
  CHECK(flags[1] == std::vector<bool>{true});
  CHECK(flags[2] == std::vector<bool>{false, true});
  CHECK(at::equal(grads[0], grads[1]));
  CHECK(at::equal(grads[0], grads[2]));
}
