// Conformance cases for norm_rope (docs/ops/norm_rope.md): y, dx and dweight against the reference, with
// cos/sin or position ids, partial rotary, the (1 + w) weight, T=1, odd head counts, non-contiguous x.
#include "axengine/ops/norm_rope.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::NormRope;
using ops::NormRopeArgs;
using ops::NormRopeBackwardArgs;
using ops::NormRopeGrads;

struct Shape {
  std::vector<int64_t> lead;
  int64_t H, D, R;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : lead) d.push_back(std::to_string(v));
    return ax::str("lead=", join(d, "x"), ",", kv({{"H", H}, {"D", D}, {"R", R}}));
  }
};

struct Variant {
  bool positions = false, offset = false, noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{positions ? "position_ids" : "cos_sin", offset ? "1+w" : "w"};
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

struct Problem {
  at::Tensor x, w, cos, sin, pos, inv_freq, grad;
};

Problem make_problem(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  std::vector<int64_t> xs = s.lead, cs = s.lead;
  xs.push_back(s.H);
  xs.push_back(s.D);
  cs.push_back(s.R);
  Problem p;
  p.x = at::randn(xs, g, at::kFloat) * 2.0;
  p.w = at::randn({s.D}, g, at::kFloat) * 0.5 + 1.0;
  at::Tensor ang = at::rand(cs, g, at::kFloat) * 6.28;
  p.cos = ang.cos();
  p.sin = ang.sin();
  p.pos = at::randint(0, 4096, s.lead, g, at::kLong);
  p.inv_freq = at::pow(10000.0, -at::arange(0, s.R, 2, at::kFloat) / static_cast<double>(s.R));
  p.grad = at::randn(xs, g, at::kFloat);
  return p;
}

NormRopeArgs make_args(const Problem& p, const Variant& v, at::ScalarType dt, at::Device dev, bool noncontig) {
  auto prep = [&](const at::Tensor& t, at::ScalarType d) {
    at::Tensor o = t.to(dev, d);
    return noncontig ? non_contiguous(o) : o;
  };
  NormRopeArgs a;
  a.x = prep(p.x, dt);
  a.weight = prep(p.w, dt);
  a.weight_offset = v.offset;
  if (v.positions) {
    a.position_ids = p.pos.to(dev);
    a.inv_freq = p.inv_freq.to(dev);
    a.attention_scaling = 0.9;
  } else {
    a.cos = prep(p.cos, dt);
    a.sin = prep(p.sin, dt);
  }
  return a;
}

NormRopeGrads fwd_bwd(NormRope& op, const NormRopeArgs& a, const at::Tensor& grad, NormRopeGrads out = {}) {
  op.forward(a);
  NormRopeBackwardArgs b;
  b.grad_y = grad;
  b.out = out;
  return op.backward(a, b);
}

void case_pair(CaseRunner& cases, const std::string& dtype, const Shape& s, const Variant& v) {
  const Target& T = cases.target();
  for (const char* phase : {"fwd", "bwd"}) {
    const std::string name = ax::str("norm_rope/", phase, "/", dtype, "/", s.name(), "/", v.name());
    cases.run(name, [&, phase = std::string(phase)] {
      const at::ScalarType dt = scalar_type(dtype);
      Problem p = make_problem(s, name, T.seed);
      NormRopeArgs ra = make_args(p, v, dt, T.reference_device, false);
      NormRopeArgs ia = make_args(p, v, dt, T.device, v.noncontig);
      InputGuard guard;
      for (auto& [n, t] : std::vector<std::pair<std::string, at::Tensor>>{
               {"x", ia.x}, {"weight", ia.weight}, {"cos", ia.cos}, {"sin", ia.sin}, {"position_ids", ia.position_ids}})
        guard.add(n, t);
      std::vector<std::string> msgs;
      if (phase == "fwd") {
        at::Tensor want = T.ref<NormRope>().forward(ra);
        std::optional<GuardedOut> out;
        if (v.out) {
          out.emplace(want.sizes(), dt, T.device);
          ia.out = out->view();
        }
        at::Tensor got = T.impl<NormRope>().forward(ia);
        if (out) msgs.push_back(out->check("y", got));
        msgs.push_back(check_close("y", got, want.to(T.device), tolerance(dtype).forward));
      } else {
        at::Tensor grad = p.grad.to(dt);
        NormRopeGrads want = fwd_bwd(T.ref<NormRope>(), ra, grad.to(T.reference_device));
        NormRopeGrads preset;
        std::optional<GuardedOut> odx, odw;
        if (v.out) {
          odx.emplace(ia.x.sizes(), dt, T.device);
          odw.emplace(ia.weight.sizes(), dt, T.device);
          preset.dx = odx->view();
          preset.dweight = odw->view();
        }
        at::Tensor ig = v.noncontig ? non_contiguous(grad.to(T.device)) : grad.to(T.device);
        guard.add("grad_y", ig);
        NormRopeGrads got = fwd_bwd(T.impl<NormRope>(), ia, ig, preset);
        if (odx) msgs.push_back(odx->check("dx", got.dx));
        if (odw) msgs.push_back(odw->check("dweight", got.dweight));
        const double tol = tolerance(dtype).backward;
        msgs.push_back(check_close("dx", got.dx, want.dx.to(T.device), tol));
        msgs.push_back(check_close("dweight", got.dweight, want.dweight.to(T.device), tol));
      }
      msgs.push_back(guard.check());
      return join(msgs, "; ");
    });
  }
}

void determinism_case(CaseRunner& cases, const std::string& dtype) {
  const Target& T = cases.target();
  const Shape s{{3, 40}, 4, 64, 64};
  const std::string name = ax::str("norm_rope/determinism/", dtype, "/", s.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(dtype);
    Problem p = make_problem(s, name, T.seed);
    NormRopeArgs a = make_args(p, {}, dt, T.device, false);
    at::Tensor grad = p.grad.to(T.device, dt);
    auto& op = T.impl<NormRope>();
    NormRopeGrads g1 = fwd_bwd(op, a, grad), g2 = fwd_bwd(op, a, grad);
    return join({check_bitwise("y", op.forward(a), op.forward(a)), check_bitwise("dx", g1.dx, g2.dx),
                 check_bitwise("dweight", g1.dweight, g2.dweight)},
                "; ");
  });
}

void bad_input_cases(CaseRunner& cases, const std::string& dtype) {
  const Target& T = cases.target();
  const Shape s{{5}, 2, 32, 32};
  const std::string pre = ax::str("norm_rope/badinput/", dtype);
  const at::ScalarType dt = scalar_type(dtype);
  Problem p = make_problem(s, pre, T.seed);
  const NormRopeArgs good = make_args(p, {}, dt, T.device, false);
  auto fwd = [&](const NormRopeArgs& a) { T.impl<NormRope>().forward(a); };
  struct Bad {
    std::string what, argument;
    std::function<void()> fn;
  };
  std::vector<Bad> bad = {
      {"weight_size", "weight", [&] { auto a = good; a.weight = a.weight.narrow(0, 0, s.D - 1); fwd(a); }},
      {"x_dtype", "x", [&] { auto a = good; a.x = a.x.to(at::kInt); fwd(a); }},
      {"cos_shape", "cos", [&] { auto a = good; a.cos = a.cos.narrow(-1, 0, s.R - 1); fwd(a); }},
      {"sin_missing", "sin", [&] { auto a = good; a.sin = at::Tensor(); fwd(a); }},
      {"rotary_wider_than_head", "cos",
       [&] {
         auto a = good;
         a.cos = at::cat({a.cos, a.cos}, -1);
         a.sin = at::cat({a.sin, a.sin}, -1);
         fwd(a);
       }},
      {"inv_freq_wider_than_head", "inv_freq",
       [&] {
         auto a = good;
         a.cos = a.sin = at::Tensor();
         a.position_ids = p.pos.to(T.device);
         at::Tensor f = p.inv_freq.to(T.device);
         a.inv_freq = at::cat({f, f, f});  // rotary dim 3·R > D
         fwd(a);
       }},
      {"grad_y_shape", "grad_y",
       [&] {
         NormRopeBackwardArgs b;
         b.grad_y = at::zeros({5, 2, 31}, good.x.options());
         T.impl<NormRope>().backward(good, b);
       }},
  };
  for (auto& b : bad) cases.run(ax::str(pre, "/", b.what), [&] { return check_throws_naming(b.argument, b.fn); });
}

}  // namespace

void run_norm_rope(CaseRunner& cases) {
  const Target& T = cases.target();
  std::vector<Shape> shapes = {{{17}, 3, 64, 64}, {{1}, 1, 34, 34}, {{2, 9}, 5, 130, 66}, {{3}, 2, 128, 32}};
  if (!T.quick) shapes.push_back({{4, 65}, 8, 256, 256});
  const std::vector<Variant> vs = {{}, {.positions = true}, {.offset = true}, {.positions = true, .offset = true, .noncontig = true, .out = true}};
  for (const auto& dtype : T.dtypes) {
    for (const auto& s : shapes)
      for (const auto& v : vs) case_pair(cases, dtype, s, v);
    determinism_case(cases, dtype);
    bad_input_cases(cases, dtype);
  }
}

}  // namespace ax::conformance::detail
