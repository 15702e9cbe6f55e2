// The conformance problems of causal_conv1d (docs/ops/causal_conv1d.md): y, final_state, dx and
// d initial_state against the reference over packed batches — sequences shorter than the kernel window, a
// length-1 and an empty sequence, so the window's reset at every boundary shows — kernel widths 4 (Qwen3.5,
// Qwen3-Next), 2 and 1, initial states in and final states out, a non-contiguous x (a slice of a wider
// projection output), a preallocated y; determinism and bad input.
#include "axengine/ops/causal_conv1d.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::CausalConv1d;
using ops::CausalConv1dArgs;
using ops::CausalConv1dBackwardArgs;
using ops::CausalConv1dGrads;
using ops::CausalConv1dResult;

struct Shape {
  std::vector<int64_t> seqlens;
  int64_t C, W;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : seqlens) d.push_back(std::to_string(v));
    return ax::str("seqlens=", join(d, "+"), ",", kv({{"C", C}, {"W", W}}));
  }
  int64_t T() const {
    int64_t t = 0;
    for (auto v : seqlens) t += v;
    return t;
  }
  int64_t N() const { return static_cast<int64_t>(seqlens.size()); }
};

struct Variant {
  bool state = false;  // initial_state in, final_state out, grad_final_state back
  bool noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{state ? "state" : "nostate"};
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

struct Data {
  at::Tensor x, w, cu, init, grad, grad_final;
};

Data make_data(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator gen = case_generator(seed, name);
  const int64_t T = s.T();
  Data p;
  p.x = at::randn({T, s.C}, gen, at::kFloat);
  // transformers initialises the depthwise conv like nn.Conv1d: |w| ~ 1/sqrt(W); larger here so that
  // every tap, the oldest included, moves the output well past the tolerance.
  p.w = at::randn({s.C, s.W}, gen, at::kFloat) * 0.7;
  std::vector<int32_t> cu{0};
  for (auto l : s.seqlens) cu.push_back(cu.back() + static_cast<int32_t>(l));
  p.cu = at::tensor(cu, at::kInt);
  p.init = at::randn({s.N(), s.W - 1, s.C}, gen, at::kFloat);
  p.grad = at::randn({T, s.C}, gen, at::kFloat);
  p.grad_final = at::randn({s.N(), s.W - 1, s.C}, gen, at::kFloat);
  return p;
}

CausalConv1dArgs make_args(const Data& p, const Variant& v, at::ScalarType dt, at::Device dev, bool noncontig) {
  CausalConv1dArgs a;
  a.x = noncontig ? non_contiguous(p.x.to(dev, dt)) : p.x.to(dev, dt);
  a.weight = p.w.to(dev, dt);
  a.cu_seqlens = p.cu.to(dev);
  if (v.state) {
    a.initial_state = p.init.to(dev, dt);
    a.output_final_state = true;
  }
  return a;
}

Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = ax::str(dtype, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("causal_conv1d/", phase == "fwd+bwd" ? "determinism" : phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, b.draw ? key + "#1" : key, seed);
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<CausalConv1dArgs>(make_args(d, v, dt, b.device, noncontig));
    args->check_values = !b.for_graph;  // the value checks read cu_seqlens on the host
    at::Tensor grad = d.grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    at::Tensor grad_final = v.state ? d.grad_final.to(b.device, dt) : at::Tensor();
    Call c;
    c.inputs = {{"x", args->x}, {"weight", args->weight}, {"cu_seqlens", args->cu_seqlens}};
    if (v.state) c.inputs.emplace_back("initial_state", args->initial_state);
    if (phase != "fwd") {
      c.inputs.emplace_back("grad_y", grad);
      if (grad_final.defined()) c.inputs.emplace_back("grad_final_state", grad_final);
    }
    c.run = [args, grad, grad_final, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<CausalConv1d>();
      Tensors res;
      if (phase != "bwd") {
        CausalConv1dArgs a = *args;
        a.out = output(out, "y");
        CausalConv1dResult r = op.forward(a);
        res.emplace_back("y", r.y);
        if (args->output_final_state) res.emplace_back("final_state", r.final_state);
      }
      if (phase != "fwd") {
        CausalConv1dBackwardArgs bw;
        bw.grad_y = grad;
        bw.grad_final_state = grad_final;
        CausalConv1dGrads g = op.backward(*args, bw);
        res.emplace_back("dx", g.dx);
        if (args->initial_state.defined()) res.emplace_back("dinitial_state", g.dinitial_state);
      }
      return res;
    };
    return c;
  };
  const OpTolerance& tol = suite.spec().tolerance(dtype);
  if (phase == "fwd") {
    p.compare = {{"y", tol.forward}};
    if (v.state) p.compare.emplace_back("final_state", tol.forward);
    if (v.out) p.preallocated = {"y"};
  } else if (phase == "bwd") {
    p.compare = {{"dx", tol.backward}};
    if (v.state) p.compare.emplace_back("dinitial_state", tol.backward);
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype) {
  const Shape s{{3, 4}, 6, 4};
  const at::ScalarType dt = scalar_type(dtype);
  Data p = make_data(s, ax::str("causal_conv1d/badinput/", dtype), suite.seed());
  const CausalConv1dArgs good = make_args(p, {.state = true}, dt, suite.device(), false);
  auto fwd = [](const Backend& be, const CausalConv1dArgs& a) { be.as<CausalConv1d>().forward(a); };
  auto opt = at::TensorOptions().device(suite.device());
  using B = const Backend&;
  return {
      {"x_rank", "x", [=](B be) { auto a = good; a.x = a.x.unsqueeze(0); fwd(be, a); }},
      {"x_dtype", "x", [=](B be) { auto a = good; a.x = a.x.to(at::kInt); fwd(be, a); }},
      {"weight_channels", "weight", [=](B be) { auto a = good; a.weight = a.weight.narrow(0, 0, 5); fwd(be, a); }},
      {"weight_dtype", "weight",
       [=](B be) { auto a = good; a.weight = a.weight.to(dt == at::kFloat ? at::kHalf : at::kFloat); fwd(be, a); }},
      {"cu_seqlens_total", "cu_seqlens",
       [=](B be) { auto a = good; a.cu_seqlens = at::tensor(std::vector<int32_t>{0, 3, 6}, opt.dtype(at::kInt)); fwd(be, a); }},
      {"initial_state_window", "initial_state",
       [=](B be) { auto a = good; a.initial_state = a.initial_state.narrow(1, 0, 2); fwd(be, a); }},
      {"out_shape", "out", [=](B be) { auto a = good; a.out = at::empty({7, 5}, opt.dtype(dt)); fwd(be, a); }},
      {"grad_y_shape", "grad_y",
       [=](B be) {
         CausalConv1dBackwardArgs b;
         b.grad_y = at::zeros({7, 5}, opt.dtype(dt));
         be.as<CausalConv1d>().backward(good, b);
       }},
      {"grad_final_state_unasked", "grad_final_state",
       [=](B be) {
         auto a = good;
         a.output_final_state = false;
         CausalConv1dBackwardArgs b;
         b.grad_y = p.grad.to(suite.device(), dt);
         b.grad_final_state = p.grad_final.to(suite.device(), dt);
         be.as<CausalConv1d>().backward(a, b);
       }},
  };
}

}  // namespace

void causal_conv1d_problems(Suite& suite) {
  std::vector<Shape> shapes = {
      {{2, 9, 1, 3, 0, 6}, 40, 4},  // sequences shorter than the window, length 1, empty, W = 4
      {{17}, 24, 2},                // one sequence, W = 2
      {{5, 3}, 8, 1},               // W = 1: no state rows
  };
  if (!suite.quick()) shapes.push_back({{300, 129, 1}, 256, 4});
  const std::vector<Variant> vs = {{}, {.state = true}, {.state = true, .noncontig = true, .out = true}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < vs.size(); ++j)
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], vs[j]);
          p.graph = i == 0 && j == 2;
          suite.accuracy(p);
        }
    suite.determinism(problem(suite, "fwd+bwd", dtype, {{7, 30}, 16, 4}, {.state = true}));
    suite.bad_inputs(dtype, bad_inputs(suite, dtype));
  }
}

}  // namespace ax::conformance::detail
