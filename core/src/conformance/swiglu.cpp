// The conformance problems of swiglu (docs/ops/swiglu.md): y and the gradients against the reference, with
// gate and up as separate tensors, as the two strided halves of one [*, 2I] output, and as gate_up; leading
// dims, one row, odd I, gates large enough that sigmoid saturates; determinism, repeat and bad input. The
// checks themselves are the suite's generic ones (suite.cpp).
#include "axengine/ops/swiglu.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::Swiglu;
using ops::SwigluArgs;
using ops::SwigluBackwardArgs;

struct Shape {
  std::vector<int64_t> lead;
  int64_t I;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : lead) d.push_back(std::to_string(v));
    return ax::str("lead=", join(d, "x"), ",", kv({{"I", I}}));
  }
};

// How gate and up are passed: "split" (two contiguous tensors), "halves" (views of one [*, 2I] tensor:
// row stride 2I), "noncontig" (every other column of wider buffers), "gate_up" (the fused tensor).
struct Variant {
  std::string layout = "split";
  std::string name() const { return layout; }
};

struct Data {
  at::Tensor gate_up, grad;  // fp32 [*, 2I], [*, I]
};

Data make_data(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  std::vector<int64_t> gs = s.lead, ys = s.lead;
  gs.push_back(2 * s.I);
  ys.push_back(s.I);
  Data p;
  // Gates up to ~±12: sigmoid saturates at both ends; up of the same size so both terms matter.
  p.gate_up = at::randn(gs, g, at::kFloat) * 3.0;
  p.grad = at::randn(ys, g, at::kFloat);
  return p;
}

SwigluArgs make_args(const Data& p, const Variant& v, at::ScalarType dt, at::Device dev, bool as_tested) {
  at::Tensor gu = p.gate_up.to(dev, dt);
  const int64_t I = gu.size(-1) / 2;
  SwigluArgs a;
  if (v.layout == "gate_up") {
    a.gate_up = gu;
  } else if (v.layout == "halves" && as_tested) {
    a.gate = gu.narrow(-1, 0, I);
    a.up = gu.narrow(-1, I, I);
  } else if (v.layout == "noncontig" && as_tested) {
    a.gate = non_contiguous(gu.narrow(-1, 0, I).contiguous());
    a.up = non_contiguous(gu.narrow(-1, I, I).contiguous());
  } else {
    a.gate = gu.narrow(-1, 0, I).contiguous();
    a.up = gu.narrow(-1, I, I).contiguous();
  }
  return a;
}

Tensors inputs_of(const SwigluArgs& a) { return {{"gate", a.gate}, {"up", a.up}, {"gate_up", a.gate_up}}; }

// phase "fwd": y; "bwd": the gradients; "fwd+bwd": all (determinism, repeat).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("swiglu/", phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, b.draw ? key + "#1" : key, seed);
    auto args = std::make_shared<SwigluArgs>(make_args(d, v, dt, b.device, b.as_tested));
    at::Tensor grad = d.grad.to(b.device, dt);
    if (b.as_tested && v.layout == "noncontig") grad = non_contiguous(grad);
    Call c;
    c.inputs = inputs_of(*args);
    if (phase != "fwd") c.inputs.emplace_back("grad_y", grad);
    c.run = [args, grad, phase](const Backend& be, const Tensors&) {
      auto& op = be.as<Swiglu>();
      Tensors res;
      at::Tensor y = op.forward(*args);
      if (phase != "bwd") res.emplace_back("y", y);
      if (phase != "fwd") {
        SwigluBackwardArgs bwd;
        bwd.grad_y = grad;
        auto g = op.backward(*args, bwd);
        res.emplace_back("dgate", g.dgate);
        res.emplace_back("dup", g.dup);
        res.emplace_back("dgate_up", g.dgate_up);
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  const bool fused = v.layout == "gate_up";
  if (phase == "fwd") {
    p.compare = {{"y", tol.forward}};
    p.extra = [](const Tensors& got, const Tensors&) -> std::string {
      if (!output(got, "y").is_contiguous()) fail("y must be contiguous");
      return "y contiguous";
    };
  } else if (phase == "bwd") {
    if (fused) p.compare = {{"dgate_up", tol.backward}};
    else p.compare = {{"dgate", tol.backward}, {"dup", tol.backward}};
    p.extra = [fused](const Tensors& got, const Tensors&) -> std::string {
      const bool has_split = output(got, "dgate").defined() || output(got, "dup").defined();
      if (fused && (has_split || !output(got, "dgate_up").is_contiguous()))
        fail("with gate_up: dgate_up (contiguous) only, no dgate/dup");
      if (!fused && output(got, "dgate_up").defined()) fail("with gate and up: dgate and dup only, no dgate_up");
      return "gradients as the contract says";
    };
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{{5}, 16};
  const at::ScalarType dt = scalar_type(dtype);
  const at::Device dev = suite.device();
  Data p = make_data(s, ax::str("swiglu/badinput/", dtype), suite.seed());
  const SwigluArgs good = make_args(p, {}, dt, dev, false);
  const SwigluArgs fused = make_args(p, {"gate_up"}, dt, dev, false);
  auto fwd = [](const Backend& be, const SwigluArgs& a) { be.as<Swiglu>().forward(a); };
  return {
      {"up_shape", "up", [=](const Backend& be) { auto a = good; a.up = a.up.narrow(-1, 0, s.I - 1); fwd(be, a); }},
      {"up_dtype", "up", [=](const Backend& be) { auto a = good; a.up = a.up.to(at::kDouble); fwd(be, a); }},
      {"up_missing", "up", [=](const Backend& be) { auto a = good; a.up = at::Tensor(); fwd(be, a); }},
      {"gate_dtype", "gate", [=](const Backend& be) { auto a = good; a.gate = a.gate.to(at::kInt); a.up = a.up.to(at::kInt); fwd(be, a); }},
      {"both_given", "gate_up", [=](const Backend& be) { auto a = good; a.gate_up = fused.gate_up; fwd(be, a); }},
      {"none_given", "gate_up", [=](const Backend& be) { fwd(be, SwigluArgs{}); }},
      {"gate_up_odd", "gate_up", [=](const Backend& be) { auto a = fused; a.gate_up = a.gate_up.narrow(-1, 0, 2 * s.I - 1); fwd(be, a); }},
      {"grad_y_shape", "grad_y",
       [=](const Backend& be) {
         SwigluBackwardArgs b;
         b.grad_y = at::zeros({5, 2 * s.I}, fused.gate_up.options());  // gate_up's shape, not y's
         be.as<Swiglu>().backward(fused, b);
       }},
  };
}

}  // namespace

void swiglu_problems(Suite& suite) {
  std::vector<Shape> shapes = {{{17}, 64}, {{1}, 1}, {{2, 9}, 130}, {{3}, 1000}};
  if (!suite.quick()) shapes.push_back({{4, 65}, 1536});
  const std::vector<Variant> vs = {{"split"}, {"halves"}, {"noncontig"}, {"gate_up"}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], vs[j]);
          p.graph = i == 0;
          suite.accuracy(p);
        }
    for (const char* layout : {"halves", "gate_up"})
      suite.determinism(problem(suite, "fwd+bwd", dtype, {{3, 40}, 256}, {layout}));
    suite.repeat(problem(suite, "fwd+bwd", dtype, {{3, 40}, 256}, {"gate_up"}),
                 problem(suite, "fwd+bwd", dtype, {{7}, 96}, {"split"}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
