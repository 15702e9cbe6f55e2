// The conformance problems of norm_rope (docs/ops/norm_rope.md): y, dx and dweight against the reference,
// with cos/sin or position ids, partial rotary, the (1 + w) weight, T=1, odd head counts, non-contiguous x;
// determinism and bad input. The checks themselves are the suite's generic ones (suite.cpp).
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

struct Data {
  at::Tensor x, w, cos, sin, pos, inv_freq, grad;
};

Data make_data(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  std::vector<int64_t> xs = s.lead, cs = s.lead;
  xs.push_back(s.H);
  xs.push_back(s.D);
  cs.push_back(s.R);
  Data p;
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

NormRopeArgs make_args(const Data& p, const Variant& v, at::ScalarType dt, at::Device dev, bool noncontig) {
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

Tensors inputs_of(const NormRopeArgs& a) {
  return {{"x", a.x}, {"weight", a.weight}, {"cos", a.cos}, {"sin", a.sin}, {"position_ids", a.position_ids},
          {"inv_freq", a.inv_freq}};
}

// phase "fwd": y; "bwd": dx, dweight (forward then backward); "fwd+bwd": all three (determinism).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = phase == "fwd+bwd" ? ax::str(dtype, "/", s.name()) : ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("norm_rope/", phase == "fwd+bwd" ? "determinism" : phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, b.draw ? key + "#1" : key, seed);
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<NormRopeArgs>(make_args(d, v, dt, b.device, noncontig));
    at::Tensor grad = d.grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    Call c;
    c.inputs = inputs_of(*args);
    if (phase != "fwd") c.inputs.emplace_back("grad_y", grad);
    c.run = [args, grad, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<NormRope>();
      Tensors res;
      if (phase != "bwd") {
        NormRopeArgs a = *args;
        a.out = output(out, "y");
        res.emplace_back("y", op.forward(a));
      }
      if (phase != "fwd") {
        NormRopeGrads preset{output(out, "dx"), output(out, "dweight")};
        NormRopeGrads g = fwd_bwd(op, *args, grad, preset);
        res.emplace_back("dx", g.dx);
        res.emplace_back("dweight", g.dweight);
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  if (phase == "fwd") {
    p.compare = {{"y", tol.forward}};
    if (v.out) p.preallocated = {"y"};
  } else if (phase == "bwd") {
    p.compare = {{"dx", tol.backward}, {"dweight", tol.backward}};
    if (v.out) p.preallocated = {"dx", "dweight"};
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{{5}, 2, 32, 32};
  const at::ScalarType dt = scalar_type(dtype);
  const at::Device dev = suite.device();
  Data p = make_data(s, ax::str("norm_rope/badinput/", dtype), suite.seed());
  const NormRopeArgs good = make_args(p, {}, dt, dev, false);
  auto fwd = [](const Backend& be, const NormRopeArgs& a) { be.as<NormRope>().forward(a); };
  return {
      {"weight_size", "weight", [=](const Backend& be) { auto a = good; a.weight = a.weight.narrow(0, 0, s.D - 1); fwd(be, a); }},
      {"x_dtype", "x", [=](const Backend& be) { auto a = good; a.x = a.x.to(at::kInt); fwd(be, a); }},
      {"cos_shape", "cos", [=](const Backend& be) { auto a = good; a.cos = a.cos.narrow(-1, 0, s.R - 1); fwd(be, a); }},
      {"sin_missing", "sin", [=](const Backend& be) { auto a = good; a.sin = at::Tensor(); fwd(be, a); }},
      {"rotary_wider_than_head", "cos",
       [=](const Backend& be) {
         auto a = good;
         a.cos = at::cat({a.cos, a.cos}, -1);
         a.sin = at::cat({a.sin, a.sin}, -1);
         fwd(be, a);
       }},
      {"inv_freq_wider_than_head", "inv_freq",
       [=](const Backend& be) {
         auto a = good;
         a.cos = a.sin = at::Tensor();
         a.position_ids = p.pos.to(dev);
         at::Tensor f = p.inv_freq.to(dev);
         a.inv_freq = at::cat({f, f, f});  // rotary dim 3·R > D
         fwd(be, a);
       }},
      {"grad_y_shape", "grad_y",
       [=](const Backend& be) {
         NormRopeBackwardArgs b;
         b.grad_y = at::zeros({5, 2, 31}, good.x.options());
         be.as<NormRope>().backward(good, b);
       }},
  };
}

}  // namespace

void norm_rope_problems(Suite& suite) {
  // The last two: more heads than a run of 8 with a partial batch (11 = 8 + 3) and a partial rotary of
  // 3 vectors (48 of 64) — the shapes a heads-major kernel (one item per token and run of heads) must get right.
  std::vector<Shape> shapes = {{{17}, 3, 64, 64}, {{1}, 1, 34, 34}, {{2, 9}, 5, 130, 66}, {{3}, 2, 128, 32},
                               {{2, 7}, 11, 128, 128}, {{5}, 9, 64, 48}};
  if (!suite.quick()) shapes.push_back({{4, 65}, 8, 256, 256});
  const std::vector<Variant> vs = {{}, {.positions = true}, {.offset = true}, {.positions = true, .offset = true, .noncontig = true, .out = true}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], vs[j]);
          p.graph = i == 0 && (j == 1 || j == 3);  // position ids, and non-contiguous with preallocated outputs
          suite.accuracy(p);
        }
    suite.determinism(problem(suite, "fwd+bwd", dtype, {{3, 40}, 4, 64, 64}, {}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
