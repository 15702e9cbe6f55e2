// The conformance problems of linear_ce (docs/ops/linear_ce.md): loss, lse and dh against the reference,
// with ignored targets (some, all, a custom ignore_index), rows whose target is the row's largest logit,
// logits of ±30..40 (exp overflows fp16 and a naive bf16 sum), V no multiple of 8, T=1, a non-contiguous h;
// determinism, repeat and bad input. Every problem also runs as training does: forward(grad_in_forward),
// then backward with the forward's `saved` ("fwd+bwd/…/grad_in_forward": loss, lse and dh against the
// reference, which ignores the flag and recomputes; a backend that ignores it passes the same way).
// The checks themselves are the suite's generic ones (suite.cpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "axengine/ops/linear_ce.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

// loss = lse − logit[target] is the difference of two numbers of lse's size, so its error is bounded
// relative to lse, not to itself: a row whose target is its largest logit has a loss far smaller than
// either term (a correct fp32 kernel misses it by ~1e-5 of its own size). Norm-relative to
// max(||loss||, ||lse||), NaN/Inf, shape and dtype checked as check_close does.
std::string check_loss(const Tensors& got, const Tensors& want, double tol) {
  const at::Tensor g = output(got, "loss"), w = output(want, "loss");
  check_close("loss", g, w, std::numeric_limits<double>::infinity());  // shape, dtype, finiteness
  auto norm = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble).norm().item<double>(); };
  const double scale = std::max({norm(w), norm(output(want, "lse")), 1e-30});
  const double err = norm(g.detach().to(at::kCPU, at::kDouble) - w.detach().to(at::kCPU, at::kDouble)) / scale;
  if (!(err <= tol)) fail(ax::str("loss: error ", err, " of max(|loss|, |lse|) > tolerance ", tol));
  return ax::str("loss err=", err, " (of max(|loss|, |lse|)) tol=", tol);
}


using ops::LinearCe;
using ops::LinearCeArgs;
using ops::LinearCeBackwardArgs;

struct Shape {
  int64_t T, H, V;
  std::string name() const { return kv({{"T", T}, {"H", H}, {"V", V}}); }
};

struct Variant {
  bool ignore = false;       // about a third of the targets ignored
  bool all_ignored = false;  // every target ignored: loss and dh exactly zero
  bool max_target = false;   // the first and last rows' targets are their largest logit
  bool large = false;        // logits of about ±30..40
  bool noncontig = false;
  int64_t ignore_index = -100;
  bool in_forward = false;  // forward with grad_in_forward, backward from its `saved`
  std::string name() const {
    std::vector<std::string> p{all_ignored ? "all_ignored" : ignore ? "ignore" : "targets"};
    if (ignore_index != -100) p.push_back(ax::str("ignore_index=", ignore_index));
    if (max_target) p.push_back("max_target");
    if (large) p.push_back("large_logits");
    if (noncontig) p.push_back("noncontig");
    if (in_forward) p.push_back("grad_in_forward");
    return join(p, ",");
  }
};

struct Data {
  at::Tensor h, w, targets, grad_loss;  // h, w fp32 masters
};

Data make_data(const Shape& s, const Variant& v, at::ScalarType dt, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  Data p;
  p.h = at::randn({s.T, s.H}, g, at::kFloat);
  // Logits ~ N(0, σ²): σ = 3 plain; σ = 12 puts the largest of each row near ±40.
  p.w = at::randn({s.V, s.H}, g, at::kFloat) * ((v.large ? 12.0 : 3.0) / std::sqrt(double(s.H)));
  p.targets = at::randint(0, s.V, {s.T}, g, at::kLong);
  if (v.ignore || v.all_ignored) {
    at::Tensor drop = v.all_ignored ? at::ones({s.T}, at::kBool) : at::rand({s.T}, g, at::kFloat) < 0.33;
    p.targets = at::where(drop, at::full_like(p.targets, v.ignore_index), p.targets);
  }
  if (v.max_target) {  // from the values the backend sees (rounded to dt)
    at::Tensor z = at::matmul(p.h.to(dt).to(at::kFloat), p.w.to(dt).to(at::kFloat).t());
    at::Tensor top = z.argmax(1);
    p.targets[0] = top[0];
    p.targets[s.T - 1] = top[s.T - 1];
  }
  p.grad_loss = at::rand({s.T}, g, at::kFloat) + 0.5;
  return p;
}

LinearCeArgs make_args(const Data& p, const Variant& v, at::ScalarType dt, at::Device dev, bool noncontig) {
  LinearCeArgs a;
  a.h = p.h.to(dev, dt);
  if (noncontig) a.h = non_contiguous(a.h);
  a.weight = p.w.to(dev, dt);
  a.targets = p.targets.to(dev);
  a.ignore_index = v.ignore_index;
  a.grad_in_forward = v.in_forward;
  return a;
}

Tensors inputs_of(const LinearCeArgs& a) { return {{"h", a.h}, {"weight", a.weight}, {"targets", a.targets}}; }

// dh = grad_loss · Σ_v (p_v − [v = target]) · W_v sums terms of size ~|grad_loss|·‖W_v‖ whose sum can be far
// smaller (a confident row: p_target near 1, the gradient nearly cancels), so its error is bounded relative
// to the terms, not to itself: norm-relative to max(‖dh‖, `scale`), scale ≈ ‖grad_loss‖ · 2·max‖W_v‖ from the
// problem's construction. (Found on the H200: even the reference on CUDA missed such an fp32 case by 2.4e-5
// of its own size against the CPU reference, a GEMM summing in another order.)
std::string check_dh(const Tensors& got, const Tensors& want, double tol, double scale) {
  const at::Tensor g = output(got, "dh"), w = output(want, "dh");
  check_close("dh", g, w, std::numeric_limits<double>::infinity());  // shape, dtype, finiteness
  auto norm = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble).norm().item<double>(); };
  const double denom = std::max({norm(w), scale, 1e-30});
  const double err = norm(g.detach().to(at::kCPU, at::kDouble) - w.detach().to(at::kCPU, at::kDouble)) / denom;
  if (!(err <= tol)) fail(ax::str("dh: error ", err, " of max(|dh|, ", scale, ") > tolerance ", tol));
  return ax::str("dh err=", err, " tol=", tol);
}

// phase "fwd": loss, lse; "bwd": dh (forward, then backward on its lse); "fwd+bwd": all (determinism, repeat).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("linear_ce/", phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, v, dt, b.draw ? key + "#1" : key, seed);
    auto args = std::make_shared<LinearCeArgs>(make_args(d, v, dt, b.device, b.as_tested && v.noncontig));
    args->check_values = !b.for_graph;
    at::Tensor grad = d.grad_loss.to(b.device);
    Call c;
    c.inputs = inputs_of(*args);
    if (phase != "fwd") c.inputs.emplace_back("grad_loss", grad);
    c.run = [args, grad, phase](const Backend& be, const Tensors&) {
      auto& op = be.as<LinearCe>();
      auto r = op.forward(*args);
      Tensors res;
      if (phase != "bwd") res = {{"loss", r.loss}, {"lse", r.lse}};
      if (phase != "fwd") {
        LinearCeBackwardArgs bwd;
        bwd.grad_loss = grad;
        bwd.lse = r.lse;
        bwd.saved = r.saved;  // empty unless grad_in_forward was asked for and honoured
        res.emplace_back("dh", op.backward(*args, bwd));
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  // make_data: ‖W_v‖ ≈ σ (3, or 12 for large logits), grad_loss in [0.5, 1.5].
  const double dh_scale = 2.0 * (v.large ? 12.0 : 3.0) * std::sqrt(static_cast<double>(s.T));
  if (phase == "fwd") {
    p.compare = {{"lse", tol.forward}};
    const double t = tol.forward;
    p.extra = [t](const Tensors& got, const Tensors& want) -> std::string {
      const std::string loss = check_loss(got, want, t);
      // Ignored targets give exactly 0, whatever the backend's rounding.
      at::Tensor zero = output(want, "loss").eq(0);
      if (output(got, "loss").masked_select(zero).ne(0).any().item<bool>()) fail("loss must be exactly 0 at ignored targets");
      return loss + "; exact zeros at ignored targets";
    };
  } else if (phase == "bwd") {
    const double tb = tol.backward;
    p.extra = [tb, dh_scale](const Tensors& got, const Tensors& want) { return check_dh(got, want, tb, dh_scale); };
  } else if (v.in_forward) {
    // The training path: the forward's loss and lse come from another kernel path than the plain
    // forward's, and dh from the saved unit gradient (one rounding more, within the same tolerance).
    p.compare = {{"lse", tol.forward}};
    const double t = tol.forward, tb = tol.backward;
    p.extra = [t, tb, dh_scale](const Tensors& got, const Tensors& want) -> std::string {
      const std::string loss = check_loss(got, want, t) + "; " + check_dh(got, want, tb, dh_scale);
      at::Tensor zero = output(want, "loss").eq(0);
      if (output(got, "loss").masked_select(zero).ne(0).any().item<bool>()) fail("loss must be exactly 0 at ignored targets");
      // The reference's dh rows are exactly 0 at ignored targets only (structure, not cancellation).
      at::Tensor zero_rows = output(want, "dh").ne(0).any(1).logical_not();
      if (output(got, "dh").ne(0).any(1).logical_and(zero_rows).any().item<bool>())
        fail("dh must be exactly 0 at ignored targets");
      return loss + "; exact zeros at ignored targets";
    };
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{5, 16, 40};
  const at::ScalarType dt = scalar_type(dtype);
  const at::Device dev = suite.device();
  Data p = make_data(s, {}, dt, ax::str("linear_ce/badinput/", dtype), suite.seed());
  const LinearCeArgs good = make_args(p, {}, dt, dev, false);
  auto fwd = [](const Backend& be, const LinearCeArgs& a) { be.as<LinearCe>().forward(a); };
  auto bwd = [=](const Backend& be, const std::function<void(LinearCeBackwardArgs&)>& edit) {
    LinearCeBackwardArgs b;
    b.grad_loss = at::ones({s.T}, good.h.options().dtype(at::kFloat));
    b.lse = at::ones({s.T}, good.h.options().dtype(at::kFloat));
    edit(b);
    be.as<LinearCe>().backward(good, b);
  };
  return {
      {"h_rank", "h", [=](const Backend& be) { auto a = good; a.h = a.h.unsqueeze(0); fwd(be, a); }},
      {"weight_hidden", "weight", [=](const Backend& be) { auto a = good; a.weight = a.weight.narrow(1, 0, s.H - 1); fwd(be, a); }},
      {"weight_dtype", "weight", [=](const Backend& be) { auto a = good; a.weight = a.weight.to(at::kDouble); fwd(be, a); }},
      {"targets_dtype", "targets", [=](const Backend& be) { auto a = good; a.targets = a.targets.to(at::kInt); fwd(be, a); }},
      {"targets_shape", "targets", [=](const Backend& be) { auto a = good; a.targets = a.targets.narrow(0, 0, s.T - 1); fwd(be, a); }},
      {"target_out_of_range", "targets",
       [=](const Backend& be) {
         auto a = good;
         a.targets = a.targets.clone();
         a.targets[2] = s.V;
         fwd(be, a);
       }},
      {"grad_loss_dtype", "grad_loss", [=](const Backend& be) { bwd(be, [](auto& b) { b.grad_loss = b.grad_loss.to(at::kHalf); }); }},
      {"lse_shape", "lse", [=](const Backend& be) { bwd(be, [](auto& b) { b.lse = b.lse.narrow(0, 0, 4); }); }},
      {"saved_shape", "saved",
       [=](const Backend& be) { bwd(be, [&](auto& b) { b.saved = {at::zeros({s.T, s.H + 1}, good.h.options())}; }); }},
      {"saved_dtype", "saved",
       [=](const Backend& be) {
         bwd(be, [&](auto& b) { b.saved = {at::zeros({s.T, s.H}, good.h.options().dtype(at::kDouble))}; });
       }},
  };
}

}  // namespace

void linear_ce_problems(Suite& suite) {
  // fp16 GEMMs are slow on CPU: the quick grid keeps the edge cases (T=1, V no multiple of 8) small.
  std::vector<Shape> shapes = {{17, 64, 96}, {1, 32, 50}, {33, 130, 1001}};
  if (!suite.quick()) {
    shapes.push_back({64, 256, 4000});
    shapes.push_back({300, 512, 32003});
  }
  const std::vector<Variant> vs = {{},
                                   {.ignore = true},
                                   {.max_target = true},
                                   {.ignore = true, .large = true, .noncontig = true, .ignore_index = -1},
                                   {.all_ignored = true}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd", "fwd+bwd"}) {
          Variant v = vs[j];
          v.in_forward = std::string(phase) == "fwd+bwd";
          Problem p = problem(suite, phase, dtype, shapes[i], v);
          p.graph = i == 0 && (j == 1 || j == 3);
          suite.accuracy(p);
        }
    suite.determinism(problem(suite, "fwd+bwd", dtype, {70, 128, 1003}, {.ignore = true, .large = true}));
    suite.determinism(
        problem(suite, "fwd+bwd", dtype, {70, 128, 1003}, {.ignore = true, .large = true, .in_forward = true}));
    suite.repeat(problem(suite, "fwd+bwd", dtype, {70, 128, 1003}, {.ignore = true}),
                 problem(suite, "fwd+bwd", dtype, {5, 64, 96}, {}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
