// The conformance problems of rms_norm (docs/ops/rms_norm.md): y, sum, rstd, dx and dweight against the
// reference, with and without the residual, w and 1 + w, with and without dweight and a gradient reaching
// `sum`, leading dims, one row, odd hidden sizes, non-contiguous inputs; determinism, repeat and bad input.
// The checks themselves are the suite's generic ones (suite.cpp).
#include "axengine/ops/rms_norm.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::RmsNorm;
using ops::RmsNormArgs;
using ops::RmsNormBackwardArgs;

struct Shape {
  std::vector<int64_t> lead;
  int64_t H;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : lead) d.push_back(std::to_string(v));
    return ax::str("lead=", join(d, "x"), ",", kv({{"H", H}}));
  }
};

struct Variant {
  bool residual = false, offset = false, noncontig = false, no_dweight = false, grad_sum = false;
  std::string name() const {
    std::vector<std::string> p{residual ? "residual" : "noresidual", offset ? "1+w" : "w"};
    if (noncontig) p.push_back("noncontig");
    if (no_dweight) p.push_back("no_dweight");
    if (grad_sum) p.push_back("grad_sum");
    return join(p, ",");
  }
};

struct Data {
  at::Tensor x, residual, w, grad, grad_sum;
};

Data make_data(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  std::vector<int64_t> xs = s.lead;
  xs.push_back(s.H);
  Data p;
  p.x = at::randn(xs, g, at::kFloat) * 2.0;
  p.residual = at::randn(xs, g, at::kFloat) * 2.0;
  p.w = at::randn({s.H}, g, at::kFloat) * 0.5 + 1.0;
  p.grad = at::randn(xs, g, at::kFloat);
  p.grad_sum = at::randn(xs, g, at::kFloat);
  return p;
}

RmsNormArgs make_args(const Data& p, const Variant& v, at::ScalarType dt, at::Device dev, bool noncontig) {
  auto prep = [&](const at::Tensor& t) {
    at::Tensor o = t.to(dev, dt);
    return noncontig ? non_contiguous(o) : o;
  };
  RmsNormArgs a;
  a.x = prep(p.x);
  if (v.residual) a.residual = prep(p.residual);
  a.weight = prep(p.w);
  a.eps = 1e-5;
  a.weight_offset = v.offset;
  return a;
}

Tensors inputs_of(const RmsNormArgs& a) { return {{"x", a.x}, {"residual", a.residual}, {"weight", a.weight}}; }

// phase "fwd": y, sum, rstd; "bwd": dx, dweight (forward, then backward on its sum and rstd); "fwd+bwd": all
// of them (determinism, repeat).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("rms_norm/", phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, b.draw ? key + "#1" : key, seed);
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<RmsNormArgs>(make_args(d, v, dt, b.device, noncontig));
    at::Tensor grad = d.grad.to(b.device, dt), grad_sum = v.grad_sum ? d.grad_sum.to(b.device, dt) : at::Tensor();
    if (noncontig) grad = non_contiguous(grad);
    Call c;
    c.inputs = inputs_of(*args);
    if (phase != "fwd") {
      c.inputs.emplace_back("grad_y", grad);
      c.inputs.emplace_back("grad_sum", grad_sum);
    }
    c.run = [args, grad, grad_sum, phase, v](const Backend& be, const Tensors&) {
      auto& op = be.as<RmsNorm>();
      auto r = op.forward(*args);
      Tensors res;
      if (phase != "bwd") res = {{"y", r.y}, {"sum", r.sum}, {"rstd", r.rstd}};
      if (phase != "fwd") {
        RmsNormBackwardArgs bwd;
        bwd.grad_y = grad;
        bwd.grad_sum = grad_sum;
        bwd.sum = r.sum.defined() ? r.sum : args->x;
        bwd.rstd = r.rstd;
        bwd.need_dweight = !v.no_dweight;
        auto g = op.backward(*args, bwd);
        res.emplace_back("dx", g.dx);
        if (!v.no_dweight) res.emplace_back("dweight", g.dweight);
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  if (phase == "fwd") {
    p.compare = {{"y", tol.forward}, {"rstd", tol.forward}};
    if (v.residual) p.compare.emplace_back("sum", tol.forward);
    p.extra = [v](const Tensors& got, const Tensors&) -> std::string {
      if (!v.residual && output(got, "sum").defined()) fail("sum must be undefined without a residual");
      return "sum as the contract says";
    };
  } else if (phase == "bwd") {
    p.compare = {{"dx", tol.backward}};
    if (!v.no_dweight) p.compare.emplace_back("dweight", tol.backward);
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{{5}, 32};
  const at::ScalarType dt = scalar_type(dtype);
  const at::Device dev = suite.device();
  Data p = make_data(s, ax::str("rms_norm/badinput/", dtype), suite.seed());
  const RmsNormArgs good = make_args(p, {.residual = true}, dt, dev, false);
  auto fwd = [](const Backend& be, const RmsNormArgs& a) { be.as<RmsNorm>().forward(a); };
  // A backward call whose forward-side tensors are right; `edit` breaks one of them.
  auto bwd = [=](const Backend& be, const std::function<void(RmsNormBackwardArgs&)>& edit) {
    RmsNormBackwardArgs b;
    b.grad_y = at::ones_like(good.x);
    b.sum = good.x;
    b.rstd = at::ones({s.lead[0]}, good.x.options().dtype(at::kFloat));
    edit(b);
    be.as<RmsNorm>().backward(good, b);
  };
  return {
      {"weight_size", "weight", [=](const Backend& be) { auto a = good; a.weight = a.weight.narrow(0, 0, s.H - 1); fwd(be, a); }},
      {"weight_dtype", "weight", [=](const Backend& be) { auto a = good; a.weight = a.weight.to(at::kDouble); fwd(be, a); }},
      {"x_dtype", "x", [=](const Backend& be) { auto a = good; a.x = a.x.to(at::kInt); fwd(be, a); }},
      {"residual_shape", "residual", [=](const Backend& be) { auto a = good; a.residual = a.residual.narrow(0, 0, 4); fwd(be, a); }},
      {"eps_negative", "eps", [=](const Backend& be) { auto a = good; a.eps = -1; fwd(be, a); }},
      {"grad_y_shape", "grad_y", [=](const Backend& be) { bwd(be, [](auto& b) { b.grad_y = b.grad_y.narrow(1, 0, 31); }); }},
      {"sum_missing", "sum", [=](const Backend& be) { bwd(be, [](auto& b) { b.sum = at::Tensor(); }); }},
      {"rstd_shape", "rstd", [=](const Backend& be) { bwd(be, [](auto& b) { b.rstd = b.rstd.narrow(0, 0, 4); }); }},
      {"rstd_dtype", "rstd", [=](const Backend& be) { bwd(be, [](auto& b) { b.rstd = b.rstd.to(at::kHalf); }); }},
      {"grad_sum_dtype", "grad_sum", [=](const Backend& be) { bwd(be, [](auto& b) { b.grad_sum = b.grad_y.to(at::kInt); }); }},
  };
}

}  // namespace

void rms_norm_problems(Suite& suite) {
  std::vector<Shape> shapes = {{{17}, 64}, {{1}, 33}, {{2, 9}, 130}, {{3}, 1000}};
  if (!suite.quick()) shapes.push_back({{4, 65}, 4096});
  const std::vector<Variant> vs = {{},
                                   {.residual = true},
                                   {.offset = true},
                                   {.residual = true, .offset = true, .noncontig = true, .grad_sum = true},
                                   {.residual = true, .no_dweight = true}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], vs[j]);
          p.graph = i == 0 && j == 3;  // residual, non-contiguous, grad_sum
          suite.accuracy(p);
        }
    const Variant all{.residual = true, .grad_sum = true};
    suite.determinism(problem(suite, "fwd+bwd", dtype, {{3, 40}, 256}, all));
    suite.repeat(problem(suite, "fwd+bwd", dtype, {{3, 40}, 256}, all), problem(suite, "fwd+bwd", dtype, {{7}, 96}, {}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
