// Conformance cases for linear.lora (docs/ops/linear.lora.md): y and dx, dA, dB against the reference
// with dense, nf4, mxfp4 and nvfp4 weights, leading dims, T=1, odd sizes, non-contiguous inputs and guarded outputs.
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

struct Problem {
  at::Tensor x, w, a, b, bias, grad;
};

Problem make_problem(const Shape& s, const std::string& name, unsigned seed) {
  at::Generator g = case_generator(seed, name);
  std::vector<int64_t> xs = s.lead, ys = s.lead;
  xs.push_back(s.K);
  ys.push_back(s.N);
  Problem p;
  p.x = at::randn(xs, g, at::kFloat);
  p.w = at::randn({s.N, s.K}, g, at::kFloat) / std::sqrt(static_cast<double>(s.K));
  p.a = at::randn({s.r, s.K}, g, at::kFloat) / std::sqrt(static_cast<double>(s.K));
  p.b = at::randn({s.N, s.r}, g, at::kFloat) / std::sqrt(static_cast<double>(s.r));
  p.bias = at::randn({s.N}, g, at::kFloat) * 0.5;
  p.grad = at::randn(ys, g, at::kFloat);
  return p;
}

LinearLoraArgs make_args(const Problem& p, const Variant& v, const ops::WeightTensor& w, at::ScalarType dt,
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

void case_pair(CaseRunner& cases, const std::string& dtype, const std::string& variant, const Shape& s, const Variant& v) {
  const Target& T = cases.target();
  for (const char* phase : {"fwd", "bwd"}) {
    const std::string name = ax::str("linear.lora/", phase, "/", dtype, "/", variant, "/", s.name(), "/", v.name());
    cases.run(name, [&, phase = std::string(phase)] {
      const at::ScalarType dt = scalar_type(dtype);
      Problem p = make_problem(s, name, T.seed);
      ops::WeightTensor w = make_weight(p.w, variant, -1, dt);
      LinearLoraArgs ra = make_args(p, v, w, dt, T.reference_device, false);
      LinearLoraArgs ia = make_args(p, v, w, dt, T.device, v.noncontig);
      InputGuard guard;
      guard.add("x", ia.x);
      guard.add("weight", w.is_dense() ? ia.weight.values : ia.weight.codes);
      guard.add("lora_a", ia.lora_a);
      guard.add("lora_b", ia.lora_b);
      guard.add("bias", ia.bias);
      std::vector<std::string> msgs;
      if (phase == "fwd") {
        at::Tensor want = T.ref<LinearLora>().forward(ra);
        std::optional<GuardedOut> out;
        if (v.out) {
          out.emplace(want.sizes(), dt, T.device);
          ia.out = out->view();
        }
        at::Tensor got = T.impl<LinearLora>().forward(ia);
        if (out) msgs.push_back(out->check("y", got));
        msgs.push_back(check_close("y", got, want.to(T.device), tolerance(dtype).forward));
      } else {
        at::Tensor grad = p.grad.to(dt);
        LinearLoraGrads want = fwd_bwd(T.ref<LinearLora>(), ra, grad.to(T.reference_device));
        LinearLoraGrads preset;
        std::optional<GuardedOut> odx, oda, odb;
        if (v.out) {
          odx.emplace(ia.x.sizes(), dt, T.device);
          preset.dx = odx->view();
          if (v.lora) {
            oda.emplace(ia.lora_a.sizes(), dt, T.device);
            odb.emplace(ia.lora_b.sizes(), dt, T.device);
            preset.dlora_a = oda->view();
            preset.dlora_b = odb->view();
          }
        }
        at::Tensor ig = v.noncontig ? non_contiguous(grad.to(T.device)) : grad.to(T.device);
        guard.add("grad_y", ig);
        LinearLoraGrads got = fwd_bwd(T.impl<LinearLora>(), ia, ig, preset);
        if (odx) msgs.push_back(odx->check("dx", got.dx));
        if (oda) msgs.push_back(oda->check("dlora_a", got.dlora_a));
        if (odb) msgs.push_back(odb->check("dlora_b", got.dlora_b));
        const double tol = tolerance(dtype).backward;
        msgs.push_back(check_close("dx", got.dx, want.dx.to(T.device), tol));
        if (v.lora) {
          msgs.push_back(check_close("dlora_a", got.dlora_a, want.dlora_a.to(T.device), tol));
          msgs.push_back(check_close("dlora_b", got.dlora_b, want.dlora_b.to(T.device), tol));
        }
      }
      msgs.push_back(guard.check());
      return join(msgs, "; ");
    });
  }
}

void determinism_case(CaseRunner& cases, const std::string& dtype, const std::string& variant) {
  const Target& T = cases.target();
  const Shape s{{4, 48}, 64, 40, 4};
  const Variant v{.lora = true, .bias = true};
  const std::string name = ax::str("linear.lora/determinism/", dtype, "/", variant, "/", s.name(), "/", v.name());
  cases.run(name, [&] {
    const at::ScalarType dt = scalar_type(dtype);
    Problem p = make_problem(s, name, T.seed);
    LinearLoraArgs a = make_args(p, v, make_weight(p.w, variant, -1, dt), dt, T.device, false);
    at::Tensor grad = p.grad.to(T.device, dt);
    auto& op = T.impl<LinearLora>();
    at::Tensor y1 = op.forward(a), y2 = op.forward(a);
    LinearLoraGrads g1 = fwd_bwd(op, a, grad), g2 = fwd_bwd(op, a, grad);
    return join({check_bitwise("y", y1, y2), check_bitwise("dx", g1.dx, g2.dx),
                 check_bitwise("dlora_a", g1.dlora_a, g2.dlora_a), check_bitwise("dlora_b", g1.dlora_b, g2.dlora_b)},
                "; ");
  });
}

void bad_input_cases(CaseRunner& cases, const std::string& dtype, const std::string& variant) {
  const Target& T = cases.target();
  const Shape s{{6}, 64, 24, 2};
  const std::string pre = ax::str("linear.lora/badinput/", dtype, "/", variant);
  const at::ScalarType dt = scalar_type(dtype);
  Problem p = make_problem(s, pre, T.seed);
  const LinearLoraArgs good = make_args(p, {.lora = true, .bias = true}, make_weight(p.w, variant, -1, dt), dt, T.device, false);
  auto fwd = [&](const LinearLoraArgs& a) { T.impl<LinearLora>().forward(a); };
  auto opt = at::TensorOptions().device(T.device);
  struct Bad {
    std::string what, argument;
    std::function<void()> fn;
  };
  std::vector<Bad> bad = {
      {"x_width", "x", [&] { auto a = good; a.x = a.x.narrow(-1, 0, s.K - 1); fwd(a); }},
      {"x_dtype", "x", [&] { auto a = good; a.x = a.x.to(at::kInt); fwd(a); }},
      {"lora_a_shape", "lora_a", [&] { auto a = good; a.lora_a = a.lora_a.narrow(1, 0, s.K - 1); fwd(a); }},
      {"lora_b_rank", "lora_b", [&] { auto a = good; a.lora_b = a.lora_b.narrow(1, 0, 1); fwd(a); }},
      {"lora_b_without_lora_a", "lora_a", [&] { auto a = good; a.lora_a = at::Tensor(); fwd(a); }},
      {"bias_shape", "bias", [&] { auto a = good; a.bias = a.bias.narrow(0, 0, s.N - 1); fwd(a); }},
      {"out_shape", "out", [&] { auto a = good; a.out = at::empty({2, s.N}, opt.dtype(dt)); fwd(a); }},
      {"grad_y_shape", "grad_y",
       [&] {
         LinearLoraBackwardArgs b;
         b.grad_y = at::zeros({6, s.N + 1}, opt.dtype(dt));
         T.impl<LinearLora>().backward(good, b);
       }},
  };
  for (auto& b : bad) cases.run(ax::str(pre, "/", b.what), [&] { return check_throws_naming(b.argument, b.fn); });
}

}  // namespace

void run_linear_lora(CaseRunner& cases) {
  const Target& T = cases.target();
  std::vector<std::string> variants;
  for (const char* v : {"dense", "nf4", "nf4-dq", "mxfp4", "nvfp4"})
    if (T.claims_format(base_format(v))) variants.push_back(v);
  const std::vector<Variant> vs = {{.lora = true, .bias = true}, {.lora = false, .bias = true}, {.lora = true},
                                   {.lora = true, .bias = true, .noncontig = true, .out = true}};
  for (const auto& dtype : T.dtypes)
    for (const auto& variant : variants) {
      const bool nf4 = variant != "dense";
      // Packed weights: nf4 blocks run over the flattened [N, K] weight, mxfp4 / nvfp4 ones along K (32 / 16):
      // keep K a multiple of 64.
      std::vector<Shape> shapes = {{{17}, nf4 ? 64 : 65, 130, 3}, {{1}, nf4 ? 64 : 16, 24, 1}, {{2, 3}, nf4 ? 128 : 33, 17, 5}};
      if (!T.quick) shapes.push_back({{4, 33}, 256, 96, 16});
      for (const auto& s : shapes)
        for (const auto& v : vs) case_pair(cases, dtype, variant, s, v);
      determinism_case(cases, dtype, variant);
      bad_input_cases(cases, dtype, variant);
    }
}

}  // namespace ax::conformance::detail
