// The conformance problems of linear.lora (docs/ops/linear.lora.md): y and dx, dA, dB against the reference
// with dense, nf4, mxfp4 and nvfp4 weights, leading dims, T=1, odd sizes, non-contiguous inputs and guarded outputs;
// determinism and bad input. The checks themselves are the suite's generic ones (suite.cpp).
#include "axengine/ops/linear_lora.hpp"
#include "axengine/strings.hpp"
#include "conformance/harness.hpp"

namespace ax::conformance::detail {
namespace {

using ops::LinearLora;
using ops::LinearLoraArgs;
using ops::LinearLoraBackwardArgs;
using ops::LinearLoraGrads;

struct Shape {
  std::vector<int64_t> lead;
  int64_t K, N, r;
  std::string name() const {
    std::vector<std::string> d;
    for (auto v : lead) d.push_back(std::to_string(v));
    return ax::str("lead=", join(d, "x"), ",", kv({{"K", K}, {"N", N}, {"r", r}}));
  }
};

struct Variant {
  bool lora = true, bias = false, noncontig = false, out = false;
  std::string name() const {
    std::vector<std::string> p{lora ? "lora" : "nolora"};
    if (bias) p.push_back("bias");
    if (noncontig) p.push_back("noncontig");
    if (out) p.push_back("out");
    return join(p, ",");
  }
};

struct Data {
  at::Tensor x, w, a, b, bias, grad;
};

Data make_data(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  std::vector<int64_t> xs = s.lead, ys = s.lead;
  xs.push_back(s.K);
  ys.push_back(s.N);
  Data p;
  p.x = at::randn(xs, g, at::kFloat);
  p.w = at::randn({s.N, s.K}, g, at::kFloat) / std::sqrt(static_cast<double>(s.K));
  p.a = at::randn({s.r, s.K}, g, at::kFloat) / std::sqrt(static_cast<double>(s.K));
  p.b = at::randn({s.N, s.r}, g, at::kFloat) / std::sqrt(static_cast<double>(s.r));
  p.bias = at::randn({s.N}, g, at::kFloat) * 0.5;
  p.grad = at::randn(ys, g, at::kFloat);
  return p;
}

LinearLoraArgs make_args(const Data& p, const Variant& v, const ops::WeightTensor& w, at::ScalarType dt,
                         at::Device dev, bool noncontig) {
  auto prep = [&](const at::Tensor& t) {
    at::Tensor o = t.to(dev, dt);
    return noncontig ? non_contiguous(o) : o;
  };
  LinearLoraArgs a;
  a.x = prep(p.x);
  a.weight = weight_to(w, dev);
  if (a.weight.is_dense()) a.weight.values = prep(a.weight.values);
  if (v.lora) {
    a.lora_a = prep(p.a);
    a.lora_b = prep(p.b);
    a.scaling = 0.75;
  }
  if (v.bias) a.bias = prep(p.bias);
  return a;
}

LinearLoraGrads fwd_bwd(LinearLora& op, const LinearLoraArgs& a, const at::Tensor& grad, LinearLoraGrads out = {}) {
  op.forward(a);
  LinearLoraBackwardArgs b;
  b.grad_y = grad;
  b.out = out;
  return op.backward(a, b);
}

Tensors inputs_of(const LinearLoraArgs& a) {
  return {{"x", a.x}, {"weight", a.weight.is_dense() ? a.weight.values : a.weight.codes}, {"weight.scales", a.weight.scales},
          {"lora_a", a.lora_a}, {"lora_b", a.lora_b}, {"bias", a.bias}};
}

// phase "fwd": y; "bwd": dx (and dlora_a, dlora_b with LoRA); "fwd+bwd": all (determinism).
Problem problem(const Suite& suite, const std::string& phase, const std::string& dtype, const std::string& variant,
                const Shape& s, const Variant& v) {
  Problem p;
  p.phase = phase;
  p.name = ax::str(dtype, "/", variant, "/", s.name(), "/", v.name());
  p.dtype = dtype;
  const std::string key = ax::str("linear.lora/", phase == "fwd+bwd" ? "determinism" : phase, "/", p.name);
  const unsigned seed = suite.seed();
  p.bind = [=](const Bind& b) {
    const at::ScalarType dt = scalar_type(dtype);
    Data d = make_data(s, b.draw ? key + "#1" : key, seed);
    const bool noncontig = b.as_tested && v.noncontig;
    auto args = std::make_shared<LinearLoraArgs>(make_args(d, v, make_weight(d.w, variant, -1, dt), dt, b.device, noncontig));
    at::Tensor grad = d.grad.to(b.device, dt);
    if (noncontig) grad = non_contiguous(grad);
    Call c;
    c.inputs = inputs_of(*args);
    if (phase != "fwd") c.inputs.emplace_back("grad_y", grad);
    c.run = [args, grad, phase](const Backend& be, const Tensors& out) {
      auto& op = be.as<LinearLora>();
      Tensors res;
      if (phase != "bwd") {
        LinearLoraArgs a = *args;
        a.out = output(out, "y");
        res.emplace_back("y", op.forward(a));
      }
      if (phase != "fwd") {
        LinearLoraGrads preset{output(out, "dx"), output(out, "dlora_a"), output(out, "dlora_b")};
        LinearLoraGrads g = fwd_bwd(op, *args, grad, preset);
        res.emplace_back("dx", g.dx);
        res.emplace_back("dlora_a", g.dlora_a);
        res.emplace_back("dlora_b", g.dlora_b);
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
    p.compare = {{"dx", tol.backward}};
    if (v.lora) {
      p.compare.push_back({"dlora_a", tol.backward});
      p.compare.push_back({"dlora_b", tol.backward});
    }
    if (v.out) p.preallocated = v.lora ? std::vector<std::string>{"dx", "dlora_a", "dlora_b"} : std::vector<std::string>{"dx"};
  }
  return p;
}

std::vector<BadInput> bad_inputs(const Suite& suite, const std::string& dtype, const std::string& variant) {
  const Shape s{{6}, 64, 24, 2};
  const at::ScalarType dt = scalar_type(dtype);
  const at::Device dev = suite.device();
  Data p = make_data(s, ax::str("linear.lora/badinput/", dtype, "/", variant), suite.seed());
  const LinearLoraArgs good = make_args(p, {.lora = true, .bias = true}, make_weight(p.w, variant, -1, dt), dt, dev, false);
  auto fwd = [](const Backend& be, const LinearLoraArgs& a) { be.as<LinearLora>().forward(a); };
  auto opt = at::TensorOptions().device(dev);
  return {
      {"x_width", "x", [=](const Backend& be) { auto a = good; a.x = a.x.narrow(-1, 0, s.K - 1); fwd(be, a); }},
      {"x_dtype", "x", [=](const Backend& be) { auto a = good; a.x = a.x.to(at::kInt); fwd(be, a); }},
      {"lora_a_shape", "lora_a", [=](const Backend& be) { auto a = good; a.lora_a = a.lora_a.narrow(1, 0, s.K - 1); fwd(be, a); }},
      {"lora_b_rank", "lora_b", [=](const Backend& be) { auto a = good; a.lora_b = a.lora_b.narrow(1, 0, 1); fwd(be, a); }},
      {"lora_b_without_lora_a", "lora_a", [=](const Backend& be) { auto a = good; a.lora_a = at::Tensor(); fwd(be, a); }},
      {"bias_shape", "bias", [=](const Backend& be) { auto a = good; a.bias = a.bias.narrow(0, 0, s.N - 1); fwd(be, a); }},
      {"out_shape", "out", [=](const Backend& be) { auto a = good; a.out = at::empty({2, s.N}, opt.dtype(dt)); fwd(be, a); }},
      {"grad_y_shape", "grad_y",
       [=](const Backend& be) {
         LinearLoraBackwardArgs b;
         b.grad_y = at::zeros({6, s.N + 1}, opt.dtype(dt));
         be.as<LinearLora>().backward(good, b);
       }},
  };
}

}  // namespace

void linear_lora_problems(Suite& suite) {
  std::vector<std::string> variants;
  for (const char* v : {"dense", "nf4", "nf4-dq", "nf4-b16", "nf4-dq-b32", "mxfp4", "nvfp4", "fp8", "fp8-b8x16"})
    if (suite.claims_format(base_format(v))) variants.push_back(v);
  const std::vector<Variant> vs = {{.lora = true, .bias = true}, {.lora = false, .bias = true}, {.lora = true},
                                   {.lora = true, .bias = true, .noncontig = true, .out = true}};
  for (const auto& dtype : suite.dtypes())
    for (const auto& variant : variants) {
      const bool nf4 = variant != "dense";
      // Packed weights: nf4 blocks run over the flattened [N, K] weight, mxfp4 / nvfp4 ones along K (32 / 16):
      // keep K a multiple of 64.
      std::vector<Shape> shapes = {{{17}, nf4 ? 64 : 65, 130, 3}, {{1}, nf4 ? 64 : 16, 24, 1}, {{2, 3}, nf4 ? 128 : 33, 17, 5}};
      if (!suite.quick()) shapes.push_back({{4, 33}, 256, 96, 16});
      for (std::size_t i = 0; i < shapes.size(); ++i)
        for (std::size_t j = 0; j < vs.size(); ++j)
          for (const char* phase : {"fwd", "bwd"}) {
            Problem p = problem(suite, phase, dtype, variant, shapes[i], vs[j]);
            p.graph = i == 0 && (j == 0 || j == 3);
            suite.accuracy(p);
          }
      suite.determinism(problem(suite, "fwd+bwd", dtype, variant, {{4, 48}, 64, 40, 4}, {.lora = true, .bias = true}));
      suite.bad_inputs(ax::str(dtype, "/", variant), bad_inputs(suite, dtype, variant));
    }
}

}  // namespace ax::conformance::detail
