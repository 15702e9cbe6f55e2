// rms_norm, swiglu and linear_ce: the reference forward against independent formulas and its backward
// against autograd through them (fp64); the autograd adapters (models/autograd_ops) against ATen autograd
// of the same composite, also under activation-checkpointing recompute; the aten backends against the
// reference (fp32, linear_ce with chunks small enough to split the tokens many ways); validation messages.
// bf16/fp16 accuracy of the aten backends is the conformance suite's (conformance_cli_fused_* CTests).
#include <doctest/doctest.h>

#include <functional>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include "axengine/ops/linear_ce.hpp"
#include "axengine/ops/rms_norm.hpp"
#include "axengine/ops/swiglu.hpp"
#include "axengine/registry.hpp"
#include "axengine/selection.hpp"
#include "models/autograd_ops.hpp"
#include "models/recompute.hpp"
#include "ops/aten/register_fusions.hpp"
#include "ops/reference/register.hpp"
#include "unit/ops_test_util.hpp"

using namespace ax;
using namespace ax::ops;

namespace {

const Registry& registry() {
  static Registry reg = [] {
    Registry r;
    register_reference_kernels(r);
    register_aten_fusion_kernels(r);
    return r;
  }();
  return reg;
}

template <class Op>
std::shared_ptr<Op> backend(const std::string& name) {
  const Provider* p = registry().find(ProviderKind::kernel, Op::kOp, name);
  REQUIRE(p);
  return std::static_pointer_cast<Op>(p->object);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }
at::Tensor rnd(at::IntArrayRef s, at::ScalarType dt = at::kDouble) { return at::randn(s, at::TensorOptions().dtype(dt)); }

// ---- rms_norm ----------------------------------------------------------------------------------------

// (x + r) / sqrt(mean((x + r)²) + eps) · w', written out.
std::pair<at::Tensor, at::Tensor> naive_rms(const at::Tensor& x, const at::Tensor& r, const at::Tensor& w, double eps,
                                            bool offset) {
  at::Tensor s = r.defined() ? x + r : x;
  return {s / at::sqrt((s * s).sum(-1, true) / s.size(-1) + eps) * (offset ? w + 1 : w), s};
}

}  // namespace

TEST_CASE("rms_norm reference and adapter: formula and autograd (residual, 1+w, grad_sum, leading dims), fp64") {
  at::manual_seed(1);
  auto op = backend<RmsNorm>("reference");
  for (bool residual : {false, true})
    for (bool offset : {false, true}) {
      CAPTURE(residual);
      CAPTURE(offset);
      at::Tensor x = rnd({2, 5, 24}) * 2, r = residual ? rnd({2, 5, 24}) : at::Tensor(), w = rnd({24}) * 0.5 + 1;
      at::Tensor gy = rnd({2, 5, 24}), gs = rnd({2, 5, 24});
      RmsNormArgs a{x, r, w, 1e-5, offset};
      auto res = op->forward(a);
      auto [yn, sn] = naive_rms(x, r, w, 1e-5, offset);
      CHECK(test::rel_err(res.y, yn) < 1e-13);
      CHECK(res.sum.defined() == residual);
      if (residual) CHECK(at::equal(res.sum, sn));
      CHECK(test::rel_err(res.rstd, at::rsqrt((sn * sn).mean(-1) + 1e-5).reshape({-1})) < 1e-13);
      CHECK((res.rstd.scalar_type() == at::kDouble));

      // Autograd of the formula, with a gradient reaching s when there is a residual.
      at::Tensor lx = leaf(x), lr = residual ? leaf(r) : at::Tensor(), lw = leaf(w);
      auto [y2, s2] = naive_rms(lx, lr, lw, 1e-5, offset);
      std::vector<at::Tensor> in{lx, lw};
      if (residual) in.push_back(lr);
      auto want = torch::autograd::grad(residual ? std::vector<at::Tensor>{y2, s2} : std::vector<at::Tensor>{y2}, in,
                                        residual ? std::vector<at::Tensor>{gy, gs} : std::vector<at::Tensor>{gy});
      RmsNormBackwardArgs b;
      b.grad_y = gy;
      if (residual) b.grad_sum = gs;
      b.sum = residual ? res.sum : x;
      b.rstd = res.rstd;
      auto g = op->backward(a, b);
      CHECK(test::rel_err(g.dx, want[0]) < 1e-12);
      CHECK(test::rel_err(g.dweight, want[1]) < 1e-12);
      b.need_dweight = false;
      CHECK_FALSE(op->backward(a, b).dweight.defined());

      // The adapter: y and sum as autograd outputs, gradients into x, residual and weight.
      at::Tensor ax_ = leaf(x), ar = residual ? leaf(r) : at::Tensor(), aw = leaf(w);
      auto out = autograd::rms_norm(op, RmsNormArgs{ax_, ar, aw, 1e-5, offset});
      CHECK(out.sum.defined() == residual);
      at::Tensor loss = (out.y * gy).sum();
      if (residual) loss = loss + (out.sum * gs).sum();
      loss.backward();
      CHECK(test::rel_err(ax_.grad(), want[0]) < 1e-12);
      CHECK(test::rel_err(aw.grad(), want[1]) < 1e-12);
      if (residual) CHECK(test::rel_err(ar.grad(), want[2]) < 1e-12);
    }
}

TEST_CASE("rms_norm reference: transformers' rounding points in bf16 (s, n and y rounded)") {
  at::manual_seed(2);
  auto op = backend<RmsNorm>("reference");
  at::Tensor x = rnd({7, 64}, at::kBFloat16) * 3, r = rnd({7, 64}, at::kBFloat16) * 3, w = rnd({64}, at::kBFloat16);
  auto res = op->forward(RmsNormArgs{x, r, w, 1e-6, false});
  // transformers: hidden = residual + hidden (bf16); fp32 statistics; weight * normed.to(bf16).
  at::Tensor s = r + x;
  at::Tensor sf = s.to(at::kFloat);
  at::Tensor want = w * (sf * at::rsqrt(sf.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16);
  CHECK(at::equal(res.sum, s));
  CHECK(at::equal(res.y, want));
}

TEST_CASE("swiglu reference and adapter: formula and autograd, gate/up views and gate_up, fp64") {
  at::manual_seed(3);
  auto op = backend<Swiglu>("reference");
  at::Tensor gu = rnd({3, 4, 18}) * 3, gy = rnd({3, 4, 9});
  auto f = [](const at::Tensor& g, const at::Tensor& u) { return g / (1 + at::exp(-g)) * u; };
  at::Tensor lgu = leaf(gu);
  at::Tensor yn = f(lgu.narrow(-1, 0, 9), lgu.narrow(-1, 9, 9));
  at::Tensor want = torch::autograd::grad({yn}, {lgu}, {gy})[0];
  // Strided halves of one tensor, then gate_up.
  SwigluArgs split;
  split.gate = gu.narrow(-1, 0, 9);
  split.up = gu.narrow(-1, 9, 9);
  SwigluArgs fused;
  fused.gate_up = gu;
  for (const SwigluArgs& a : {split, fused}) {
    at::Tensor y = op->forward(a);
    CHECK(y.is_contiguous());
    CHECK(test::rel_err(y, yn.detach()) < 1e-14);
    auto g = op->backward(a, SwigluBackwardArgs{gy});
    at::Tensor d = a.gate_up.defined() ? g.dgate_up : at::cat({g.dgate, g.dup}, -1);
    CHECK(a.gate_up.defined() == g.dgate_up.defined());
    CHECK(test::rel_err(d, want) < 1e-13);
  }
  // The adapter, both forms.
  at::Tensor l1 = leaf(gu);
  SwigluArgs s1;
  s1.gate = l1.narrow(-1, 0, 9);
  s1.up = l1.narrow(-1, 9, 9);
  (autograd::swiglu(op, s1) * gy).sum().backward();
  CHECK(test::rel_err(l1.grad(), want) < 1e-13);
  at::Tensor l2 = leaf(gu);
  SwigluArgs s2;
  s2.gate_up = l2;
  (autograd::swiglu(op, s2) * gy).sum().backward();
  CHECK(test::rel_err(l2.grad(), want) < 1e-13);
}

TEST_CASE("linear_ce reference and adapter: formula and autograd with ignored targets, fp64") {
  at::manual_seed(4);
  auto op = backend<LinearCe>("reference");
  const int64_t T = 11, H = 16, V = 37;
  at::Tensor h = rnd({T, H}), w = rnd({V, H}), gl = rnd({T}).abs() + 0.1;
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong);
  tgt[3] = -100;
  tgt[7] = -100;
  LinearCeArgs a{h, w, tgt, -100, true};
  auto r = op->forward(a);
  at::Tensor z = at::matmul(h, w.t());
  at::Tensor lse = at::log(at::exp(z).sum(1));
  at::Tensor nll = lse - z.gather(1, tgt.clamp_min(0).unsqueeze(1)).squeeze(1);
  nll = at::where(tgt.eq(-100), at::zeros_like(nll), nll);
  CHECK(test::rel_err(r.loss, nll) < 1e-13);
  CHECK(test::rel_err(r.lse, lse) < 1e-13);
  CHECK(r.loss[3].item<double>() == 0.0);

  at::Tensor lh = leaf(h);
  at::Tensor ce = at::cross_entropy_loss(at::matmul(lh, w.t()), tgt, {}, at::Reduction::None, -100);
  at::Tensor want = torch::autograd::grad({ce}, {lh}, {gl})[0];
  CHECK(test::rel_err(op->backward(a, LinearCeBackwardArgs{gl, r.lse}), want) < 1e-12);
  CHECK(want[3].abs().sum().item<double>() == 0.0);

  at::Tensor ah = leaf(h);
  at::Tensor loss = autograd::linear_ce(op, LinearCeArgs{ah, w, tgt, -100, false});
  CHECK(test::rel_err(loss, nll) < 1e-13);
  (loss * gl).sum().backward();
  CHECK(test::rel_err(ah.grad(), want) < 1e-12);
}

TEST_CASE("aten rms_norm, swiglu, linear_ce equal the reference in fp32; linear_ce in 1..n chunks, deterministic") {
  at::manual_seed(5);
  // rms_norm: same rounding points and op order; fp32 agrees to rounding.
  {
    auto ref = backend<RmsNorm>("reference");
    auto aten = make_aten_rms_norm();
    at::Tensor x = rnd({9, 40}, at::kFloat), r = rnd({9, 40}, at::kFloat), w = rnd({40}, at::kFloat), gy = rnd({9, 40}, at::kFloat);
    for (bool offset : {false, true}) {
      RmsNormArgs a{x, r, w, 1e-6, offset};
      auto want = ref->forward(a), got = aten->forward(a);
      CHECK(test::rel_err(got.y, want.y) < 1e-6);
      CHECK(at::equal(got.sum, want.sum));
      CHECK(test::rel_err(got.rstd, want.rstd) < 1e-6);
      RmsNormBackwardArgs b{gy, gy * 0.5, got.sum, got.rstd, true};
      auto gw = ref->backward(a, b), gg = aten->backward(a, b);
      CHECK(test::rel_err(gg.dx, gw.dx) < 1e-6);
      CHECK(test::rel_err(gg.dweight, gw.dweight) < 1e-6);
    }
  }
  {
    auto ref = backend<Swiglu>("reference");
    auto aten = make_aten_swiglu();
    SwigluArgs a;
    a.gate_up = rnd({6, 50}, at::kFloat) * 3;
    at::Tensor gy = rnd({6, 25}, at::kFloat);
    CHECK(test::rel_err(aten->forward(a), ref->forward(a)) < 1e-6);
    CHECK(test::rel_err(aten->backward(a, {gy}).dgate_up, ref->backward(a, {gy}).dgate_up) < 1e-6);
  }
  auto ref = backend<LinearCe>("reference");
  const int64_t T = 37, H = 24, V = 50;
  at::Tensor h = rnd({T, H}, at::kFloat), w = rnd({V, H}, at::kFloat) * 3, gl = rnd({T}, at::kFloat).abs();
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong);
  tgt[0] = -100;
  tgt[T - 1] = -100;
  LinearCeArgs a{h, w, tgt, -100, true};
  auto want = ref->forward(a);
  at::Tensor want_dh = ref->backward(a, {gl, want.lse});
  // One row per chunk, 20 rows per chunk (two chunks, the second partial), everything in one.
  for (int64_t bytes : {int64_t(1), int64_t(20 * V * 4), kAtenLinearCeChunkBytes}) {
    CAPTURE(bytes);
    auto op = make_aten_linear_ce(bytes);
    auto got = op->forward(a);
    CHECK(test::rel_err(got.loss, want.loss) < 1e-6);
    CHECK(test::rel_err(got.lse, want.lse) < 1e-6);
    CHECK(got.loss[0].item<float>() == 0.0f);
    at::Tensor dh = op->backward(a, {gl, got.lse});
    CHECK(test::rel_err(dh, want_dh) < 1e-6);
    CHECK(at::equal(dh, op->backward(a, {gl, got.lse})));
    CHECK(at::equal(got.loss, op->forward(a).loss));
  }
}

TEST_CASE("fused-op adapters under activation-checkpointing recompute: bitwise the same gradients") {
  // A layer-shaped function: residual-fused norm, swiglu on a gate_up product, residual out; the loss via
  // linear_ce outside. Captured parameters (P, Q) get their .grad from the recomputation.
  at::manual_seed(6);
  auto rn = backend<RmsNorm>("reference");
  auto sw = backend<Swiglu>("reference");
  auto ce = backend<LinearCe>("reference");
  const int64_t T = 13, H = 16, I = 12, V = 29;
  at::Tensor x0 = rnd({T, H}, at::kFloat), w = rnd({H}, at::kFloat) + 1, head = rnd({V, H}, at::kFloat);
  at::Tensor tgt = at::randint(0, V, {T}, at::kLong);
  at::Tensor P0 = rnd({H, H}, at::kFloat) * 0.2, Q0 = rnd({H, 2 * I}, at::kFloat) * 0.2, R = rnd({I, H}, at::kFloat) * 0.2;
  std::vector<std::vector<at::Tensor>> grads;
  for (bool recompute : {false, true}) {
    at::Tensor P = leaf(P0), Q = leaf(Q0), x = leaf(x0);
    auto layer = [=](const at::Tensor& in) {
      auto r = autograd::rms_norm(rn, RmsNormArgs{at::matmul(in, P), in, w, 1e-6, false});
      SwigluArgs s;
      s.gate_up = at::matmul(r.y, Q);
      return std::vector<at::Tensor>{r.sum + at::matmul(autograd::swiglu(sw, s), R)};
    };
    at::Tensor h = recompute ? autograd::recompute(layer, x)[0] : layer(x)[0];
    at::Tensor n = autograd::rms_norm(rn, RmsNormArgs{h, {}, w, 1e-6, false}).y;
    autograd::linear_ce(ce, LinearCeArgs{n, head, tgt, -100, false}).sum().backward();
    grads.push_back({P.grad(), Q.grad(), x.grad()});
  }
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(grads[1][i].defined());
    CHECK(at::equal(grads[0][i], grads[1][i]));
  }
}

TEST_CASE("rms_norm, swiglu, linear_ce: bad input is rejected with the argument named") {
  auto rn = backend<RmsNorm>("reference");
  at::Tensor x = at::randn({4, 8}), w = at::ones({8});
  CHECK(error_of([&] { rn->forward({x, {}, w.narrow(0, 0, 7)}); }) == "rms_norm: weight: must have shape [8], got [7]");
  CHECK(error_of([&] { rn->forward({x, x.narrow(0, 0, 3), w}); }) == "rms_norm: residual: must have shape [4, 8], got [3, 8]");
  CHECK(error_of([&] { rn->forward({x, {}, w.to(at::kHalf)}); }) == "rms_norm: weight: must be fp32, got fp16");
  CHECK(error_of([&] { rn->forward({x, {}, w, -1.0}); }).find("rms_norm: eps: must be >= 0") == 0);
  CHECK(error_of([&] { rn->backward({x, {}, w}, {x, {}, x, at::ones({3})}); }) == "rms_norm: rstd: must have shape [4], got [3]");
  CHECK(error_of([&] { rn->backward({x, {}, w}, {x, {}, {}, at::ones({4})}); }) == "rms_norm: sum: is required but was not given");

  auto sw = backend<Swiglu>("reference");
  SwigluArgs s;
  CHECK(error_of([&] { sw->forward(s); }) == "swiglu: gate_up: the op needs gate and up, or gate_up");
  s.gate_up = at::randn({3, 7});
  CHECK(error_of([&] { sw->forward(s); }).find("swiglu: gate_up: must be [..., 2*I] with an even") == 0);
  s.gate = at::randn({3, 4});
  CHECK(error_of([&] { sw->forward(s); }) == "swiglu: gate_up: give either gate and up or gate_up, not both");
  s.gate_up = at::Tensor();
  s.up = at::randn({3, 5});
  CHECK(error_of([&] { sw->forward(s); }) == "swiglu: up: must have shape [3, 4], got [3, 5]");
  s.up = at::randn({3, 4});
  CHECK(error_of([&] { sw->backward(s, {at::randn({3, 8})}); }) == "swiglu: grad_y: must have shape [3, 4], got [3, 8]");

  auto ce = backend<LinearCe>("reference");
  at::Tensor h = at::randn({5, 8}), W = at::randn({11, 8});
  CHECK(error_of([&] { ce->forward({h, W.narrow(1, 0, 7), at::zeros({5}, at::kLong)}); }) ==
        "linear_ce: weight: must be [V, 8] with V >= 1, got [11, 7]");
  CHECK(error_of([&] { ce->forward({h, W, at::zeros({5}, at::kInt)}); }) == "linear_ce: targets: must be int64, got int32");
  CHECK(error_of([&] { ce->forward({h, W, at::tensor({0, 1, 11, -100, 2}, at::kLong)}); }) ==
        "linear_ce: targets: each must be in [0, 11) or ignore_index -100, got 11 at 2");
  CHECK(error_of([&] { ce->backward({h, W, at::zeros({5}, at::kLong)}, {at::ones({5}, at::kDouble), at::ones({5})}); }) ==
        "linear_ce: grad_loss: must be fp32, got fp64");
}

TEST_CASE("selection: core's aten backends come after every plugin's, before reference, by default") {
  Registry reg;
  register_reference_kernels(reg);
  register_aten_fusion_kernels(reg);
  Provider p;  // a plugin backend whose name sorts after "aten"
  p.info.kind = ProviderKind::kernel;
  p.info.op = "rms_norm";
  p.info.name = "zz_fused";
  p.info.plugin = "zzplugin";
  p.info.origin = "axengine_zzplugin.so";
  p.info.needs.devices = {"cuda"};
  p.object = std::shared_ptr<RmsNorm>(make_aten_rms_norm());
  reg.add(std::move(p));
  Resolution r = resolve_backend(reg, KernelPreferences{}, "rms_norm", KernelQuery{DeviceInfo{}, "bf16", "", ""});
  REQUIRE(r.candidates.size() == 3);
  CHECK(r.candidates[0].backend == "zz_fused");
  CHECK(r.candidates[1].backend == "aten");
  CHECK(r.candidates[2].backend == "reference");
  CHECK(r.chosen == "aten");  // the plugin's needs CUDA
  CHECK(resolve_backend(reg, KernelPreferences{}, "rms_norm", KernelQuery{DeviceInfo{}, "fp32", "", ""}).chosen == "reference");
}
