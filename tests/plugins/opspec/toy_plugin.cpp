// The op-defining test plugin: toy.scaled_add (toy_op.hpp) as an OpSpec with its reference backend and
// conformance problems, plus three backends of it:
//   toy_good          correct (one fused fp32 add); declared CUDA-graph safe (plain ATen, no host sync)
//   toy_bug_alpha     ignores alpha (the accuracy cases catch it)
//   toy_bug_inplace   right values, but accumulates into its input x (the immutability check catches it)
#include <ATen/ATen.h>

#include <axengine/op_conformance.hpp>
#include <axengine/plugin.hpp>

#include "toy_op.hpp"

AXENGINE_PLUGIN_DESCRIPTOR(R"({
  "name": "opspec_toy", "version": "1.0.0", "summary": "defines the op toy.scaled_add",
  "providers": [
    {"kind": "op", "name": "toy.scaled_add", "summary": "y = x + alpha z"},
    {"kind": "kernel", "op": "toy.scaled_add", "name": "toy_good", "graph_safe": true,
     "requires": {"devices": ["cpu", "cuda"], "dtypes": ["fp32", "bf16"]}},
    {"kind": "kernel", "op": "toy.scaled_add", "name": "toy_bug_alpha", "requires": {"devices": ["cpu"], "dtypes": ["fp32"]}},
    {"kind": "kernel", "op": "toy.scaled_add", "name": "toy_bug_inplace", "requires": {"devices": ["cpu"], "dtypes": ["fp32"]}}
  ]
})")

namespace {

using namespace ax::conformance;
using toy::ScaledAdd;
using toy::ScaledAddArgs;
using toy::ScaledAddGrads;

at::Tensor deliver(const at::Tensor& value, const at::Tensor& out) { return out.defined() ? out.copy_(value) : value; }

// fp32 math, one rounding: the ground truth.
struct Reference : ScaledAdd {
 protected:
  at::Tensor run_forward(const ScaledAddArgs& a) override {
    at::Tensor y = a.x.to(at::kFloat) + a.alpha * a.z.to(at::kFloat);
    return deliver(y.to(a.x.scalar_type()), a.out);
  }
  ScaledAddGrads run_backward(const ScaledAddArgs& a, const at::Tensor& g) override {
    return {g.clone(), (a.alpha * g.to(at::kFloat)).to(g.scalar_type())};
  }
};

// One fused fp32 add (at::add with alpha), one rounding: within tolerance of the reference, not bitwise it.
struct Good : ScaledAdd {
 protected:
  at::Tensor run_forward(const ScaledAddArgs& a) override {
    at::Tensor y = at::add(a.x.to(at::kFloat), a.z.to(at::kFloat), a.alpha).to(a.x.scalar_type());
    return deliver(y, a.out);
  }
  ScaledAddGrads run_backward(const ScaledAddArgs& a, const at::Tensor& g) override {
    return {g.clone(), at::mul(g.to(at::kFloat), a.alpha).to(g.scalar_type())};
  }
};

struct BugAlpha : Good {
 protected:
  at::Tensor run_forward(const ScaledAddArgs& a) override { return deliver(a.x + a.z, a.out); }
};

struct BugInplace : Good {
 protected:
  at::Tensor run_forward(const ScaledAddArgs& a) override {
    at::Tensor x = a.x;
    x.add_(a.z, a.alpha);  // the bug: x is the caller's
    return deliver(x.clone(), a.out);
  }
};

struct Shape {
  std::vector<int64_t> sizes;
  std::string name() const {
    std::string s;
    for (auto v : sizes) s += (s.empty() ? "" : "x") + std::to_string(v);
    return s;
  }
};

// phase "fwd": y; "bwd": dx, dz; "fwd+bwd": all three.
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const Shape& s, bool noncontig_out) {
  Problem p;
  p.phase = phase;
  p.name = dtype + "/" + s.name() + (noncontig_out ? "/noncontig,out" : "");
  p.dtype = dtype;
  const std::string key = "toy.scaled_add/" + phase + "/" + p.name;
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    at::Generator g = case_generator(seed, b.draw ? key + "#1" : key);
    const at::ScalarType dt = scalar_type(dtype);
    auto prep = [&](const at::Tensor& t) {
      at::Tensor o = t.to(b.device, dt);
      return b.as_tested && noncontig_out ? non_contiguous(o) : o;
    };
    auto args = std::make_shared<ScaledAddArgs>();
    args->x = prep(at::randn(s.sizes, g, at::kFloat));
    args->z = prep(at::randn(s.sizes, g, at::kFloat));
    args->alpha = 0.75;  // never 1: a backend that ignores it must show
    at::Tensor grad = prep(at::randn(s.sizes, g, at::kFloat));
    Call c;
    c.inputs = {{"x", args->x}, {"z", args->z}};
    if (phase != "fwd") c.inputs.emplace_back("grad_y", grad);
    c.run = [args, grad, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<ScaledAdd>();
      Tensors res;
      if (phase != "bwd") {
        ScaledAddArgs a = *args;
        a.out = output(out, "y");
        res.emplace_back("y", op.forward(a));
      }
      if (phase != "fwd") {
        ScaledAddGrads gr = op.backward(*args, grad);
        res.emplace_back("dx", gr.dx);
        res.emplace_back("dz", gr.dz);
      }
      return res;
    };
    return c;
  };
  const ax::OpTolerance& tol = suite.spec().tolerance(dtype);
  if (phase == "fwd") {
    p.compare = {{"y", tol.forward}};
    if (noncontig_out) p.preallocated = {"y"};
  } else if (phase == "bwd") {
    p.compare = {{"dx", tol.backward}, {"dz", tol.backward}};
  }
  return p;
}

void problems(Suite& suite) {
  const std::vector<Shape> shapes = {{{17, 33}}, {{1, 7}}, {{4, 5, 130}}};
  for (const auto& dtype : suite.dtypes()) {
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (bool nc : {false, true})
        for (const char* phase : {"fwd", "bwd"}) {
          Problem p = problem(suite, phase, dtype, shapes[i], nc);
          p.graph = i == 0;
          suite.accuracy(p);
        }
    suite.determinism(problem(suite, "fwd+bwd", dtype, shapes[2], false));
    suite.repeat(problem(suite, "fwd+bwd", dtype, shapes[0], false), problem(suite, "fwd+bwd", dtype, shapes[1], false));
    const at::Device dev = suite.device();
    const ScaledAddArgs good{at::ones({3, 4}, at::TensorOptions().device(dev).dtype(scalar_type(dtype))),
                             at::ones({3, 4}, at::TensorOptions().device(dev).dtype(scalar_type(dtype))), 0.5, {}};
    suite.bad_inputs(dtype, {
        {"z_shape", "z", [=](const Backend& be) { auto a = good; a.z = a.z.narrow(1, 0, 3); be.as<ScaledAdd>().forward(a); }},
        {"x_dtype", "x", [=](const Backend& be) { auto a = good; a.x = a.x.to(at::kInt); be.as<ScaledAdd>().forward(a); }},
        {"out_shape", "out", [=](const Backend& be) { auto a = good; a.out = at::empty({2}, a.x.options()); be.as<ScaledAdd>().forward(a); }},
        {"grad_y_shape", "grad_y", [=](const Backend& be) { be.as<ScaledAdd>().backward(good, good.x.narrow(0, 0, 1)); }},
    });
  }
}

ax::OpSpec spec() {
  ax::OpSpec s;
  s.id = ScaledAdd::kOp;
  s.config_key = "toy_scaled_add";
  s.summary = "y = x + alpha z (a test plugin's own op)";
  s.dtypes = {"fp32", "bf16", "fp16"};
  s.tolerances = {{"fp32", 1e-5, 1e-5}, {"bf16", 2e-2, 2e-2}, {"fp16", 5e-3, 5e-3}};
  s.reference_summary = "fp32 math, one rounding";
  s.conformance = problems;
  return s;
}

}  // namespace

AXENGINE_PLUGIN_REGISTER(reg) {
  reg.op<ScaledAdd>(spec(), std::make_shared<Reference>());
  reg.kernel<ScaledAdd>("toy_good", std::make_shared<Good>());
  reg.kernel<ScaledAdd>("toy_bug_alpha", std::make_shared<BugAlpha>());
  reg.kernel<ScaledAdd>("toy_bug_inplace", std::make_shared<BugInplace>());
}
